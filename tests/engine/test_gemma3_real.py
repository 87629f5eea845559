"""The real Gemma 3 270M, split past its 512-token sliding window, completes as llama.cpp itself does.

A prompt shorter than the window cannot tell a right per-layer window pattern from a wrong one
(DESIGN §2b), so the prompt here is about 900 tokens. `--model gemma3` assembles the model from
its installed packages into the cache, as a newcomer would get it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.model.embedded import gemma3_model_path
from tests.conftest import run_kafila

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
CONTEXT = 2048
WORDS = ("the river carried small boats past old mills while farmers counted grain and children "
         "argued about stars lanterns bridges winter markets songs letters").split()


def _long_prompt() -> str:
    rng = np.random.default_rng(12)
    sentences = [" ".join(rng.choice(WORDS, 9)).capitalize() + "." for _ in range(80)]
    return " ".join(sentences) + " In the end, the story says that"


@pytest.fixture(scope="module")
def gemma3() -> Path:
    return gemma3_model_path()  # `make setup` installs it; without it this says what to run


def test_gemma3_split_past_window_matches_llama_cpp(gemma3: Path, tmp_path: Path) -> None:
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    prompt = _long_prompt()
    llama()  # route llama.cpp's log before Llama() would print it
    model = Llama(str(gemma3), n_ctx=CONTEXT, verbose=False)
    try:
        assert len(model.tokenize(prompt.encode())) > 600  # well past the 512-token window
        expected = model.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0)["choices"][0]["text"]
    finally:
        model.close()
    out = run_kafila("generate", "--model", "gemma3", "--split", "4,13", "--context", str(CONTEXT),
                     "--max-tokens", str(MAX_TOKENS), "--temperature", "0", prompt,
                     env={"KAFILA_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"

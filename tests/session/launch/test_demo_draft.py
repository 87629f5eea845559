"""A draft model the head cannot use (another vocabulary) is refused with both vocabularies named, and the ring
serves on, drafting by lookup: the reply is llama.cpp's own and says why there is no draft model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafila.session.launch.demo import DemoOptions
from tests.conftest import REPO, llama_cpp_reply
from tests.shared_probe import shared_probe
from tests.synthetic import write_synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = "Repeat this word for word: the ring serves what no laptop can."
TOKENS = 24


def test_a_draft_model_of_another_vocabulary_is_refused_and_the_reply_is_served(tmp_path: Path,
                                                                                  smollm: Path) -> None:
    shared_probe(tmp_path, DemoOptions().member_threads())
    other = write_synthetic(tmp_path / "other-vocab.gguf", "llama")
    env = {**os.environ, "KAFILA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(REPO / "kafila.py"), "demo", "--prompt", PROMPT, "--max-tokens",
                          str(TOKENS), "--temperature", "0", "--json", "--api-port", "0", "--throttle", "1,1,1",
                          "--draft", str(other), "--speculate", "draft"],
                         capture_output=True, text=True, env=env, timeout=800)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["text"] == llama_cpp_reply(smollm, PROMPT, TOKENS, 2048)
    spec = doc["speculation"]
    assert spec["draft_model"] is None and spec["mode"] == "draft", spec
    note = spec["draft_note"]
    assert "refused" in note and "other-vocab.gguf" in note and smollm.stem in note, note
    assert "32 tokens" in note and "49152 tokens" in note, note  # both vocabularies, told apart

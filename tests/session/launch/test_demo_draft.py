"""A draft model the head cannot use is no failed reply: one of another vocabulary is refused with both
vocabularies named, a missing one is named missing, and the ring serves on, `--speculate draft` decoding
plainly: the reply is llama.cpp's own and says why there is no draft model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.launch.demo_json import demo_json
from tests.synthetic import write_synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = "Repeat this word for word: the ring serves what no laptop can."
TOKENS = 24


@pytest.mark.parametrize("draft", ["other-vocabulary", "deleted"])
def test_a_draft_model_the_head_cannot_use_is_named_and_the_reply_is_served(tmp_path: Path, smollm: Path,
                                                                           draft: str) -> None:
    path = tmp_path / f"{draft}.gguf"
    if draft == "other-vocabulary":
        write_synthetic(path, "llama")
    doc = demo_json(tmp_path, PROMPT, TOKENS, "--draft", str(path), "--speculate", "draft")
    assert doc["text"] == llama_cpp_reply(smollm, PROMPT, TOKENS, 2048)
    spec = doc["speculation"]
    assert spec["draft_model"] is None and spec["mode"] == "off", spec  # what it did: plain decoding
    note = spec["draft_note"]
    assert f"{draft}.gguf" in note and "decoding plainly" in note and spec["drafted"] == 0, note
    if draft == "other-vocabulary":  # both vocabularies, told apart
        assert "refused" in note and smollm.stem in note and "32 tokens" in note and "49152 tokens" in note, note
    else:
        assert "is not there" in note, note

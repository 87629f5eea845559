"""A chat's `stop` strings at the head, on real llama.cpp: the reply ends before the first one, which never shows.

A ring of one (the whole SmolLM2 as the head's stage). The stop string is taken from the model's own greedy
reply across a token boundary (the end of one token's text and the start of the next), so it can only be
found by joining tokens; the reply with it must be the greedy reply cut before it, in no event a piece of it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kafila.session.ring.head import Head
from tests.conftest import llama_cpp_reply

pytestmark = pytest.mark.fast

QUESTION = "Name three colours and say one thing about each."
LONG = 40


async def events(h: Head, body: Any) -> list[dict[str, Any]]:
    return [e async for e in h.chat(body)]


def across_a_boundary(h: Head, tokens: list[int]) -> str:
    """Two characters of one token's text and three of the next: a string no single token holds."""
    pieces = [h.vocab.piece(t).decode("utf-8", "replace") for t in tokens]
    text = "".join(pieces)
    for i in range(1, len(pieces) - 1):
        stop = pieces[i][-2:] + pieces[i + 1][:3]
        if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 3 and stop.isascii() and stop.strip() == stop:
            if text.index(stop) == len("".join(pieces[:i + 1])) - 2:  # its first occurrence is this one
                return stop
    raise AssertionError(f"no token boundary to stop across in {text!r}")


async def test_a_stop_string_across_tokens_ends_the_chat_and_never_shows(head: Head, smollm: Path) -> None:
    chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": LONG, "temperature": 0}
    whole = await events(head, chat)
    text = "".join(e.get("delta", "") for e in whole)
    assert text == await asyncio.to_thread(llama_cpp_reply, smollm, QUESTION, LONG)  # the ground truth
    stop = across_a_boundary(head, [t for e in whole for t in e.get("tokens", [])])
    for stops in (stop, [stop, "never in this reply"]):
        got = await events(head, {**chat, "stop": stops})
        deltas = [e["delta"] for e in got if "delta" in e]
        assert "".join(deltas) == text[:text.index(stop)] and len(deltas) >= 1
        assert not any(stop in d for d in deltas) and got[-1]["done"]["finish_reason"] == "stop"

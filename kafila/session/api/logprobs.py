"""The head's token log-probabilities (kafila/engine/logprobs.py) in each endpoint's OpenAI shape."""

from __future__ import annotations

from typing import Any


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat choice's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}."""
    return {"content": entries, "refusal": None}


def text_logprobs(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """A text completion choice's `logprobs`: parallel lists, `text_offset` each token's start in the reply text
    from `offset` (the characters of the reply sent before these)."""
    starts, at = [], offset
    for e in entries:
        starts.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": starts}

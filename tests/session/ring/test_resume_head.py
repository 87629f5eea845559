"""The head's side of a resumed reply: rebuilt in the chunks its prompt first went in, it goes on token for token.

A ring of one (the whole SmolLM2 as the head's stage, in this process): the head tells the API server
the chunks with the first token; a request sent again with the tokens so far and those chunks must
continue with exactly the tokens the uninterrupted reply had.
"""

from __future__ import annotations

from typing import Any

import pytest

from kafila.session.ring.head import Head

pytestmark = pytest.mark.fast

# longer than a chunk (the solo head's n_batch is 128), so the prompt goes round in several
STORY = [{"role": "user", "content": "Tell me a story about a dragon who guards a library of forgotten books. " * 8}]
MAX_TOKENS = 24
CUT = 10


async def events_of(h: Head, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [evt async for evt in h.chat(body)]


def tokens_of(events: list[dict[str, Any]]) -> list[int]:
    assert "done" in events[-1], events[-1]
    return [t for e in events if "delta" in e for t in e["tokens"]]


async def test_a_resumed_reply_goes_on_with_the_uninterrupted_tokens(head: Head) -> None:
    body = {"messages": STORY, "max_tokens": MAX_TOKENS, "temperature": 0, "cache_prompt": False}
    first = await events_of(head, body)
    whole = tokens_of(first)
    cuts = next(e["prompt_cuts"] for e in first if "delta" in e)
    assert len(cuts) > 1 and all(c <= 128 for c in cuts)
    assert sum(cuts) == first[-1]["done"]["prompt_tokens"]
    again = await events_of(head, {**body, "resume": whole[:CUT], "resume_cuts": cuts,
                                   "max_tokens": MAX_TOKENS - CUT})
    assert tokens_of(again) == whole[CUT:]


async def test_resume_cuts_that_do_not_cover_the_prompt_mean_a_plain_prefill(head: Head) -> None:
    body = {"messages": STORY, "max_tokens": 4, "temperature": 0, "cache_prompt": False}
    first = tokens_of(await events_of(head, body))
    # a wrong record costs exactness only, never the reply (the API server is the only sender of these)
    again = await events_of(head, {**body, "resume": first[:2], "resume_cuts": [1, 2, 3], "max_tokens": 2})
    assert len(tokens_of(again)) == 2
    bad = await events_of(head, {**body, "resume": first[:2], "resume_cuts": "x"})
    assert bad[-1]["status"] == 400 and "resume_cuts" in bad[-1]["error"]

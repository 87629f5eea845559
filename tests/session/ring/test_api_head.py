"""The head against bad requests that reach it past the API (defence in depth), on real llama.cpp.

A ring of one: the whole SmolLM2 as the head's stage, in this process. Each bad body must be
answered with a 400-status error event and the head must go on serving: afterwards a greedy chat
gives llama-cpp-python's own text.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kafila.engine.sampler import Sampler
from kafila.session.protocol import messages
from kafila.session.protocol.authority import Sender, Via, chat_owner
from kafila.session.ring import chat_request as chat_request_module
from kafila.session.ring.head import Head
from tests.conftest import llama_cpp_reply as reference_reply
from tests.session.solo_head import N_CTX

pytestmark = pytest.mark.fast

PROMPT = "What is the capital of France?"
HI = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def llama_cpp_reply(smollm: Path) -> str:
    """Ground truth: llama-cpp-python's greedy chat completion on the whole file."""
    return reference_reply(smollm, PROMPT, 16, N_CTX)


FROM_BO = Sender("bo", Via.RING)  # bo's chat, along the ring (bo sits right before the head)


async def remote(h: Head, body: Any, via: Sender = FROM_BO) -> list[dict[str, Any]]:
    """A chat from bo, forwarded to the head as a ring member's would be (`serve_remote`), on the link `via`
    (the owner of its cache is that link's, as the head's callers take it); its events."""
    got: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def reply(msg: bytes) -> None:
        evt = messages.decode(msg)
        assert isinstance(evt, messages.ChatEvt) and (evt.id, evt.dest) == ("c1", "bo")  # back to the asker
        got.put_nowait(evt.evt)

    # A body that is not an object cannot come off the wire (messages.decode refuses it); the head
    # must still survive one handed to it directly.
    msg = messages.Chat("c1", "bo", body)
    h.serve_remote(msg, reply, chat_owner(via, msg))
    events = []
    while not events or not ({"done", "error"} & set(events[-1])):
        events.append(await asyncio.wait_for(got.get(), 120))
    return events


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e.get("delta", "") for e in events)


BAD = [
    ({"messages": HI, "temperature": "x"}, "temperature"),
    ({"messages": HI, "temperature": float("nan")}, "temperature"),
    ({"messages": HI, "top_k": "40"}, "top_k"), ({"messages": HI, "top_p": 7}, "top_p"),
    ({"messages": HI, "max_tokens": -3}, "max_tokens"), ({"messages": HI, "seed": "s"}, "seed"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"), ({"messages": None}, "messages"),
    ({"messages": HI, "resume": [10**9]}, "resume"), ({"messages": HI, "resume": "x"}, "resume"),
    ("not an object", None), ([1, 2], None),
]


async def test_bad_bodies_are_refused_and_the_head_serves_on(head: Head, llama_cpp_reply: str) -> None:
    for body, param in BAD:
        events = await remote(head, body)
        assert len(events) == 1 and events[0]["status"] == 400 and events[0]["param"] == param, (body, events)
        assert not events[0].get("resumable")
    # a null temperature is OpenAI's "the default": served, not a crash (it once was float(None) in the head)
    assert (await remote(head, {"messages": HI, "temperature": None, "max_tokens": 4}))[-1].get("done")
    events = await remote(head, {"messages": HI, "max_tokens": 16, "temperature": 0})
    assert text_of(events) == llama_cpp_reply


async def test_a_prompt_past_the_context_is_refused_with_the_numbers(head: Head) -> None:
    events = [e async for e in head.chat({"messages": [{"role": "user", "content": "word " * 2000}]})]
    assert len(events) == 1 and events[0]["status"] == 400 and events[0]["code"] == "context_length_exceeded"
    assert f"the context holds {N_CTX} per request" in events[0]["error"]
    tokens = int(events[0]["error"].split("the prompt is ")[1].split()[0])
    assert tokens > N_CTX


async def test_a_request_whose_sampling_fails_ends_alone(head: Head, llama_cpp_reply: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(Sampler):
        def sample(self, logits: Any) -> int:
            if self.params.seed == 666:
                raise ValueError("probabilities contain NaN")
            return super().sample(logits)

    monkeypatch.setattr(chat_request_module, "Sampler", Failing)  # the head makes its sampler there
    bad, good = await asyncio.gather(remote(head, {"messages": HI, "seed": 666, "temperature": 1.0}),
                                     remote(head, {"messages": HI, "max_tokens": 16, "temperature": 0}))
    # what reaches the asker, decoded from the chat_evt messages: the one error, neither resumable (the request
    # itself is bad, another ring would fail it alike) nor preceded by text
    assert bad == [{"error": "the head failed on this request: probabilities contain NaN", "status": 500}]
    assert text_of(good) == llama_cpp_reply


async def test_a_request_whose_asker_stops_reading_is_freed_not_decoded_to_its_end(head: Head,
                                                                                   llama_cpp_reply: str) -> None:
    # issue 34 item 13: a client that went away left its request decoding for nobody until max_tokens
    story = head.chat({"messages": [{"role": "user", "content": "Tell me a long story about a river."}],
                       "max_tokens": 400, "temperature": 0})
    deltas = 0
    async for evt in story:
        deltas += "delta" in evt
        if deltas == 2:
            break
    await story.aclose()  # as the API server does when its client disconnects
    at_close = head.stats.tokens  # the head decodes ahead of its reader: some were never read
    async with asyncio.timeout(60):
        while head._active:
            await asyncio.sleep(0.01)
    assert head.stats.tokens <= at_close + 1 < 400  # freed at its next sampled row, not decoded on to 400
    events = await remote(head, {"messages": HI, "max_tokens": 16, "temperature": 0})
    assert text_of(events) == llama_cpp_reply  # the slot serves the next request


async def test_a_cached_prompt_is_reused_only_for_the_member_it_came_from(head: Head) -> None:
    # issue 34 item 11: bo's user learnt from cached_tokens how much of a conversation held by the head's own
    # user's slot began like theirs
    body = {"messages": [{"role": "user", "content": "My bank PIN is 4242. Remember it."}], "max_tokens": 2,
            "temperature": 0}
    mine = [e async for e in head.chat(body)]
    assert mine[-1]["done"]["cached_tokens"] == 0
    theirs = await remote(head, body)  # the same words through bo's API
    assert theirs[-1]["done"]["cached_tokens"] == 0
    again = [e async for e in head.chat(body)]  # the head's own user's next turn still finds its cache
    assert again[-1]["done"]["cached_tokens"] > 10


async def test_a_chat_declaring_a_members_origin_on_another_link_gets_none_of_its_cache(head: Head) -> None:
    # issue 55 finding 5: a chat's origin was self-declared, so the coordinator's link (or anyone's) could claim
    # bo's slot by naming bo; the owner is the link's now
    body = {"messages": [{"role": "user", "content": "My bank PIN is 4242. Remember it."}], "max_tokens": 2,
            "temperature": 0}
    assert (await remote(head, body))[-1]["done"]["cached_tokens"] == 0  # bo's, along the ring
    forged = await remote(head, body, Sender("boss", Via.COORDINATOR))  # "bo" declared on the control link
    assert forged[-1]["done"]["cached_tokens"] == 0
    assert (await remote(head, body))[-1]["done"]["cached_tokens"] > 10  # bo's own next turn still finds it

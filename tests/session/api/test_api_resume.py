"""The API server's side of a lost member: the reply waits for the re-planned ring and goes on there; a
request that arrives while the ring is planned again waits for it too.

The heads here are stand-ins that speak the head's event protocol; test_ring_e2e kills a real
member of a real ring.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kafila.session.api import server as api_server
from kafila.session.api.server import ApiServer
from kafila.session.state import SessionState
from tests.session.api_fixtures import REPLY, start_server

pytestmark = pytest.mark.fast


async def collect(server: ApiServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [evt async for evt in server.events(body)]


async def test_a_cut_reply_resumes_with_its_tokens_on_the_next_ring() -> None:
    server = ApiServer(SessionState(phase="admitted"))
    seen: list[dict[str, Any]] = []

    async def first_ring(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        seen.append(body)
        yield {"delta": "Once", "tokens": [11, 12], "prompt_cuts": [64, 9]}
        yield {"delta": "", "tokens": [13]}  # a token whose text is still held back
        yield {"error": "member bo was lost: link closed", "resumable": True}
        server.chat = None  # the host takes the ring down ...
        await asyncio.sleep(0.3)
        server.chat = second_ring  # ... and plans a new one

    async def second_ring(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        seen.append(body)
        yield {"delta": " upon", "tokens": [14]}
        yield {"done": {"finish_reason": "length", "completion_tokens": 1}}

    server.chat = first_ring
    events = await collect(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert [e.get("delta") for e in events if "delta" in e] == ["Once", "", " upon"]
    notice = next(e["notice"] for e in events if "notice" in e)
    assert notice.startswith("member bo was lost: link closed") and "continues" in notice
    assert events[-1] == {"done": {"finish_reason": "length", "completion_tokens": 4}}
    assert "resume" not in seen[0] and seen[1]["resume"] == [11, 12, 13] and seen[1]["max_tokens"] == 1
    # the reply is rebuilt in the chunks its prompt first went in; the client never sees them
    assert seen[1]["resume_cuts"] == [64, 9] and not any("prompt_cuts" in e for e in events)


async def test_a_cut_reply_ends_with_the_reason_when_no_ring_follows() -> None:
    state = SessionState(phase="admitted")
    server = ApiServer(state)

    async def ring(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        yield {"delta": "Once", "tokens": [11]}
        yield {"error": "member bo was lost: link closed", "resumable": True}
        state.rejection = "member ada is short of 40 MB"
        state.set_phase("rejected")

    server.chat = ring
    events = await collect(server, {"messages": [], "max_tokens": 4})
    assert events[-1]["error"].startswith("member bo was lost: link closed; the session cannot go on")
    assert "short of 40 MB" in events[-1]["error"]


async def test_a_cut_reply_waits_only_so_long_for_a_ring(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(api_server, "RESUME_WAIT_S", 0.5)
    server = ApiServer(SessionState(phase="lost"))

    async def ring(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        yield {"error": "member bo was lost: link closed", "resumable": True}

    server.chat = ring
    events = await collect(server, {"messages": [], "max_tokens": 4})
    assert events[-1]["error"] == "member bo was lost: link closed; no ring was planned within 0 s"


async def test_a_reply_cut_after_its_last_token_just_ends() -> None:
    server = ApiServer(SessionState(phase="admitted"))
    calls = 0

    async def ring(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        nonlocal calls
        calls += 1
        yield {"delta": "Once upon", "tokens": [11, 12]}
        yield {"error": "member bo was lost: link closed", "resumable": True}
        server.chat = ring

    server.chat = ring
    events = await collect(server, {"messages": [], "max_tokens": 2})
    assert events[-1] == {"done": {"finish_reason": "length", "completion_tokens": 2}} and calls == 1


async def test_other_errors_end_the_reply_at_once() -> None:
    server = ApiServer(SessionState(phase="admitted"))

    async def ring(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        yield {"error": "the prompt is 900 tokens but the context holds 512"}

    server.chat = ring
    assert await collect(server, {"messages": []}) == [{"error": "the prompt is 900 tokens but the context holds 512"}]


async def post_chat(server: ApiServer) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(
            server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {server.token}"},
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}) as r:
        return r.status, await r.json()


async def test_a_request_during_a_re_plan_waits_for_the_next_ring() -> None:
    server, ring = await start_server()
    try:
        server.chat = None  # a stage drifted: the ring that served is taken down and another planned
        server.state.set_phase("planning", "planning again: bo runs 2.0× slower than planned")
        pending = asyncio.ensure_future(post_chat(server))
        await asyncio.sleep(0.5)
        assert not pending.done() and ring.bodies == []  # held, neither refused nor sent to the old ring
        server.chat = ring
        server.state.set_phase("delivering")
        server.state.set_phase("connecting")
        server.state.set_phase("admitted")
        status, answer = await pending
        assert status == 200 and answer["choices"][0]["message"]["content"] == "".join(REPLY), answer
    finally:
        await server.stop()


async def test_a_request_during_a_re_plan_waits_only_so_long(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(api_server, "REPLAN_HOLD_S", 0.3)
    server, ring = await start_server()
    try:
        server.chat = None
        server.state.set_phase("lost", "member bo was lost: link closed")
        status, answer = await post_chat(server)
        assert status == 503 and answer["error"]["code"] == "not_serving"
        assert answer["error"]["message"] == "the session is not serving (no ring was planned within 0 s)"
        assert ring.bodies == []
    finally:
        await server.stop()

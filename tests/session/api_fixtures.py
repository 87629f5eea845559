"""A real ApiServer on 127.0.0.1 with a scripted ring behind it, for the API's tests.

The ring is a stand-in that speaks the head's event protocol (the live-ring tests use the real one);
it records every body it was sent, so a test can check that a refused request never reached it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from kafila.session.api.server import ApiServer
from kafila.session.state import SessionState

CODE = "k7q2m9xd-4f8t-zr2w-9mhc-qp3a"
MODEL = "SmolLM2-135M-Instruct-Q4_1"
REPLY = ["Hello", ", world"]


def admitted_state() -> SessionState:
    """A serving session whose state holds the join code the way the host's does (and a member's typing of it)."""
    state = SessionState(role="host", me="host", code=CODE, phase="admitted", model=MODEL)
    state.log(f"session open; join code {CODE}")
    state.update_member("bo", note="joined with code K7Q2M9XD 4F8T ZR2W 9MHC QP3A")
    return state


class ScriptedRing:
    """Answers every chat with REPLY, as a head would; `bodies` are the chats it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.script: list[dict[str, Any]] | None = None  # events to answer with instead of REPLY

    async def __call__(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self.bodies.append(body)
        if self.script is not None:
            for evt in self.script:
                yield evt
            return
        for i, piece in enumerate(REPLY):
            await asyncio.sleep(0)
            yield {"delta": piece, "tokens": [100 + i]}
        yield {"done": {"finish_reason": "stop", "prompt_tokens": 9, "completion_tokens": len(REPLY),
                        "tokens_per_s": 50.0, "stages": {}, "network_share": None}}


async def start_server(state: SessionState | None = None) -> tuple[ApiServer, ScriptedRing]:
    server = ApiServer(state or admitted_state(), port=0)
    ring = ScriptedRing()
    server.chat = ring
    await server.start()
    return server, ring


@contextmanager
def server_in_thread() -> Iterator[tuple[ApiServer, ScriptedRing]]:
    """The server on its own event loop in a thread, for synchronous clients (the openai package, hypothesis)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["server"] = loop.run_until_complete(start_server())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30), "the API server did not start"
    server, ring = box["server"]
    try:
        yield server, ring
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()

"""The real chat API (kafila.session.api.server.ApiServer) in front of a scripted generator instead of a ring.

The client, `kafila chat` and the TUI's chat tests talk to the server every session runs: its routes,
its stream (notices included) and its errors, not a copy of them. Only what the ring would generate
is scripted, per test, through `Script`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kafila.session.api.server import ApiServer
from kafila.session.state import SessionState

STATS = {
    "tokens_per_s": 42.5,
    "stages": {"alpha": {"predicted_s": 0.004, "measured_s": 0.0045},
               "beta": {"predicted_s": 0.006, "measured_s": 0.0058}},
    "network_share": 0.18,
}


@dataclass
class Script:
    """What the ring behind the server generates; tests change it between requests."""

    pieces: list[str] = field(default_factory=lambda: ["Hello", ", ", "ring", "!"])
    delay_s: float = 0.0  # between pieces
    error_message: str = "the ring is busy"
    error_after: int | None = None  # the ring reports an error after this many pieces
    drop_after: int | None = None  # the server fails (the connection drops) after this many pieces
    notices: dict[int, str] = field(default_factory=dict)  # a notice before piece i
    stall_s: float = 0.0  # wait this long before the first event
    stats: dict[str, Any] | None = field(default_factory=lambda: dict(STATS))
    echo: bool = False  # reply with the last user message (or a completion's prompt), word by word
    chat_template: bool = True  # False: chats are refused as a base model's head refuses them
    requests: list[dict[str, Any]] = field(default_factory=list)
    server: ApiServer | None = None  # set by `start`

    def show(self, state: SessionState) -> None:
        """The session state the server reports (and names its model from)."""
        assert self.server is not None
        self.server.state = state

    def refuse(self, why: str) -> None:
        """The session stops serving (say, a member was lost): chats get the server's 503 naming `why`."""
        assert self.server is not None
        self.server.chat = None
        self.server.state.lost = why

    async def chat(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The events a head would send for `body`, as scripted."""
        self.requests.append(body)
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if not self.chat_template and "messages" in body:
            yield {"error": "this model has no chat template (a base model): send its text to /v1/completions "
                            "instead", "status": 400, "param": "messages", "code": "no_chat_template"}
            return
        pieces = self.pieces
        if self.echo:
            last = body["prompt"] if "prompt" in body else next(
                m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
            pieces = ["echo:"] + [" " + w for w in last.split(" ")]
        for i, piece in enumerate(pieces):
            if i in self.notices:
                yield {"notice": self.notices[i]}
            if self.error_after == i:
                yield {"error": self.error_message}
                return
            if self.drop_after == i:
                raise ConnectionResetError("scripted: the server fails mid-reply")
            yield {"delta": piece, "tokens": [i]}
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        yield {"done": {"finish_reason": "stop", **(self.stats or {})}}


async def start(script: Script) -> tuple[ApiServer, str]:
    """The real API server on a free loopback port in the running loop, serving `script`; (server, base URL)."""
    server = ApiServer(SessionState(phase="admitted", model="smollm2-135m"), port=0)
    server.chat = script.chat
    script.server = server
    return server, await server.start()


@contextmanager
def serve_in_thread(script: Script) -> Iterator[str]:
    """Run the server in its own thread and loop (for subprocess tests); yields its base URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        box["server"], box["url"] = loop.run_until_complete(start(script))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(10), "the API server did not start"
    try:
        yield box["url"]
    finally:
        asyncio.run_coroutine_threadsafe(box["server"].stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback TCP port that refuses connections while the block runs (for 'unreachable' tests).

    Bound but never listening: a connection is refused, and no other process can take the port
    meanwhile (a port found free and let go could be, and then it might answer).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])

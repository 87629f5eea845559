"""A small real aiohttp server that speaks exactly the session's chat-API contract.

It is the protocol's ground truth for the client, the chat command and the TUI's chat until
the real head serves it (see kafila/session/api_client.py for the contract). Behaviour is set
per test through `Script`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

STATS = {
    "tokens_per_s": 42.5,
    "stages": {"alpha": {"predicted_s": 0.004, "measured_s": 0.0045},
               "beta": {"predicted_s": 0.006, "measured_s": 0.0058}},
    "network_share": 0.18,
}


@dataclass
class Script:
    """What the server does; tests change it between requests."""

    pieces: list[str] = field(default_factory=lambda: ["Hello", ", ", "ring", "!"])
    delay_s: float = 0.0  # between pieces
    status: int = 200  # >= 400: answer this error before streaming
    error_message: str = "the ring is busy"
    error_after: int | None = None  # send an error chunk after this many pieces
    drop_after: int | None = None  # close the connection after this many pieces
    stall_s: float = 0.0  # wait this long before the first byte
    stats: dict[str, Any] | None = field(default_factory=lambda: dict(STATS))
    state: dict[str, Any] = field(default_factory=dict)
    model: str = "smollm2-135m"
    echo: bool = False  # reply with the last user message, word by word
    requests: list[dict[str, Any]] = field(default_factory=list)


def make_app(script: Script) -> web.Application:
    """The aiohttp application serving the contract as `script` says."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": script.model, "object": "model"}]})

    async def state(request: web.Request) -> web.Response:
        return web.json_response(script.state)

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        script.requests.append(body)
        if script.stall_s:
            await asyncio.sleep(script.stall_s)
        if script.status >= 400:
            return web.json_response({"error": {"message": script.error_message}}, status=script.status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        pieces = script.pieces
        if script.echo:
            last = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
            words = last.split(" ")
            pieces = ["echo:"] + [" " + w for w in words]

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        for i, piece in enumerate(pieces):
            if script.error_after is not None and i == script.error_after:
                await send({"error": {"message": script.error_message}})
                return resp
            if script.drop_after is not None and i == script.drop_after:
                assert request.transport is not None
                request.transport.close()
                return resp
            await send({"id": "c1", "object": "chat.completion.chunk", "model": body.get("model"),
                        "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
            if script.delay_s:
                await asyncio.sleep(script.delay_s)
        final: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk",
                                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        if script.stats is not None:
            final["kafila"] = script.stats
        await send(final)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/kafila/state", state)
    app.router.add_post("/v1/chat/completions", completions)
    return app


async def start(script: Script) -> tuple[web.AppRunner, str]:
    """Start the server on a free loopback port in the running loop; returns (runner, base URL)."""
    runner = web.AppRunner(make_app(script))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    return runner, f"http://127.0.0.1:{port}"


@contextmanager
def serve_in_thread(script: Script) -> Iterator[str]:
    """Run the server in its own thread and loop (for subprocess tests); yields its base URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(start(script))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(10), "contract server did not start"
    try:
        yield box["url"]
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def free_port() -> int:
    """A loopback port nothing listens on (for 'unreachable' tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

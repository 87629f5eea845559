"""A client that goes away mid-reply ends its request (issue 34 item 13): the server's handler is cancelled,
which closes the reply's events and so the ring's (the head then frees the slot at its next sampled row:
tests/session/ring/test_api_head.py). Before, the ring decoded for nobody until max_tokens. Real sockets
on loopback, streamed and whole replies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.session.api_fixtures import start_server

pytestmark = pytest.mark.fast


class EndlessRing:
    """A ring that answers a token every 10 ms for as long as it is read; `closed` once it is let go."""

    def __init__(self) -> None:
        self.tokens = 0
        self.closed = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            while True:
                await asyncio.sleep(0.01)
                self.tokens += 1
                yield {"delta": "word ", "tokens": [100]}
        finally:
            self.closed.set()


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_client_that_goes_away_ends_its_request(streamed: bool) -> None:
    server, _ = await start_server()
    ring = EndlessRing()
    server.chat = ring
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000,
                           "stream": streamed}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.guard.port)
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.guard.port}\r\n"
                     f"Authorization: Bearer {server.token}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        if streamed:
            assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"HTTP/1.1 200")
        async with asyncio.timeout(30):
            while ring.tokens < 5:
                await asyncio.sleep(0.01)
        writer.close()  # the client goes away
        await asyncio.wait_for(ring.closed.wait(), 30)
        at_close = ring.tokens
        await asyncio.sleep(0.2)
        assert ring.tokens == at_close  # nothing more is asked of the ring
    finally:
        await server.stop()

"""A real HTTP server with Range support on 127.0.0.1 serving one file, able to misbehave on request.

Routes: `/model.gguf` serves `Behaviour.serve`; `/redirect` answers 302 to `/hop`, which answers 302 to
`/model.gguf` (a Hugging Face `resolve` URL redirects to its CDN). Every Range asked is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


@dataclass
class Behaviour:
    """What the server serves and how it misbehaves (changeable while it runs)."""

    serve: Path
    fail: int = 0  # the next `fail` requests are answered 503
    fail_after: int | None = None  # every request after this many ranges were served is answered 503
    stalls: int = 0  # the next `stalls` responses send `stall_after` bytes, then nothing
    stall_after: int = 0
    no_range: bool = False  # answer every request 200 with the whole file
    pace_s: float = 0.0  # each response waits this long before its first byte
    asked: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of every Range asked


@dataclass
class RangeServer:
    url: str
    behaviour: Behaviour


@asynccontextmanager
async def range_server(behaviour: Behaviour) -> AsyncIterator[RangeServer]:
    """The server, listening until the block ends."""
    closing = asyncio.Event()

    async def model(request: web.Request) -> web.StreamResponse:
        b = behaviour
        size = b.serve.stat().st_size
        if b.fail > 0 or (b.fail_after is not None and len(b.asked) >= b.fail_after):
            b.fail = max(b.fail - 1, 0)
            return web.Response(status=503, text="busy")
        m = _RANGE.fullmatch(request.headers.get("Range", ""))
        if b.no_range or m is None:
            return web.FileResponse(b.serve) if not b.no_range else web.Response(body=b.serve.read_bytes())
        start, end = int(m.group(1)), min(int(m.group(2)) + 1, size)
        b.asked.append((start, end))
        await asyncio.sleep(b.pace_s)
        with b.serve.open("rb") as f:
            f.seek(start)
            data = f.read(end - start)
        resp = web.StreamResponse(status=206, headers={"Content-Range": f"bytes {start}-{end - 1}/{size}"})
        resp.content_length = len(data)
        await resp.prepare(request)
        if b.stalls > 0:
            b.stalls -= 1
            await resp.write(data[: b.stall_after])
            await asyncio.wait_for(closing.wait(), 60)  # nothing more, until the client gives up or the end
            return resp
        await resp.write(data)
        return resp

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/hop")

    async def hop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/model.gguf")

    app = web.Application()
    app.router.add_get("/model.gguf", model)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/hop", hop)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield RangeServer(f"http://127.0.0.1:{port}", behaviour)
    finally:
        closing.set()
        await runner.cleanup()


@contextlib.contextmanager
def served(*behaviours: Behaviour) -> Iterator[list[RangeServer]]:
    """range_server for each behaviour, on an event loop of their own in a thread (for tests that are not async)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="range-servers", daemon=True)
    thread.start()
    stack = contextlib.AsyncExitStack()

    async def start() -> list[RangeServer]:
        return [await stack.enter_async_context(range_server(b)) for b in behaviours]

    try:
        yield asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    finally:
        asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()

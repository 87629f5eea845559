"""Starting an in-process rendezvous on a free port pair, for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from kafila.errors import NetworkError
from kafila.net.ports import free_udp_pair
from rendezvous.server import RendezvousServer
from tests.session.cluster import PORT_TRIES


async def start_on_free_pair(make: Callable[[int], RendezvousServer]) -> RendezvousServer:
    """`make(port)` started on a free pair (P, P+1) of 127.0.0.1; a pair found free can be taken before it is
    bound, so a failed start is another try on a new pair."""
    for attempt in range(PORT_TRIES):
        server = make(free_udp_pair("127.0.0.1"))
        try:
            await server.start()
            return server
        except NetworkError:
            if attempt == PORT_TRIES - 1:
                raise
    raise AssertionError("PORT_TRIES is positive")


@asynccontextmanager
async def loopback_rendezvous() -> AsyncIterator[tuple[str, int]]:
    """A real rendezvous on 127.0.0.1 (a free port pair) while the block runs; yields its address."""
    server = await start_on_free_pair(lambda port: RendezvousServer("127.0.0.1", port))
    try:
        yield ("127.0.0.1", server.port)
    finally:
        server.close()

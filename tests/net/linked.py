"""Two peer endpoints on loopback, joined through an in-process rendezvous, and one QUIC link between them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.net.rate import LinkRate
from tests.rendezvous.inprocess import loopback_rendezvous


@asynccontextmanager
async def linked(allow_direct: bool = True, announce: dict[str, Any] | None = None,
                 host_rate: LinkRate | None = None, member_rate: LinkRate | None = None
                 ) -> AsyncIterator[tuple[PeerEndpoint, PeerEndpoint, Link, Link]]:
    """(host endpoint, member endpoint, the host's link to the member, the member's end of it); `*_rate`:
    EMULATION of each side's uplink and downlink (`--link-rate`)."""
    async with loopback_rendezvous() as rdv, \
            PeerEndpoint(bind=("127.0.0.1", 0), name="host", allow_direct=allow_direct, link_rate=host_rate) as a, \
            PeerEndpoint(bind=("127.0.0.1", 0), name="member", allow_direct=allow_direct, link_rate=member_rate) as b:
        await asyncio.gather(a.probe_nat(rdv), b.probe_nat(rdv))
        code = await a.create_session(rdv)
        await b.join_session(rdv, str(code))
        await asyncio.gather(a.announce(announce or {}), b.announce(announce or {}))
        await asyncio.gather(a.wait_for_members(2, 10), b.wait_for_members(2, 10))
        link = await a.connect(a.peers[b.member_id])
        yield a, b, link, await b.accept(10)

"""A real rendezvous server on loopback with real endpoints: the token goes out once, re-joins prove the key."""

from __future__ import annotations

import asyncio

import pytest

from kafila.net import wire
from kafila.net.endpoint import PeerEndpoint
from kafila.net.ports import free_udp_pair
from rendezvous.core import Addr
from rendezvous.server import RendezvousServer

pytestmark = pytest.mark.timeout(60)


async def test_members_rejoin_with_their_key_and_send_the_token_once() -> None:
    port = free_udp_pair("127.0.0.1")
    server = RendezvousServer("127.0.0.1", port)
    seen: list[tuple[bytes, Addr]] = []
    rejoined = asyncio.Event()
    original = server.dispatch

    def recording(data: bytes, src: Addr, local: Addr) -> None:
        seen.append((data, src))
        original(data, src, local)
        if server.core is not None and server.core.stats.rejoins >= 6:
            rejoined.set()

    server.dispatch = recording  # type: ignore[method-assign]
    await server.start()
    rdv = ("127.0.0.1", port)
    try:
        async with PeerEndpoint(bind=("127.0.0.1", 0), name="a", rendezvous_ping_s=0.05) as a, \
                PeerEndpoint(bind=("127.0.0.1", 0), name="b", rendezvous_ping_s=0.05) as b:
            code = await a.create_session(rdv)
            await b.join_session(rdv, code)
            async with asyncio.timeout(20):
                await rejoined.wait()  # both members have re-joined a few times
            assert server.core is not None
            session = server.core.sessions[code.session_id]
            for ep in (a, b):
                m = session.members[ep.member_id]
                assert m.addr == ep.local_addr and m.reg_key == ep._reg_key
            token = code.join_token.hex().encode()
            for ep in (a, b):
                sent = [d for d, src in seen if src == ep.local_addr]
                ops = [wire.decode(d).body.get("op") for d in sent if wire.kind_of(d) == "kafila"]  # type: ignore[union-attr]
                assert sum(token in d for d in sent) == 1, "the join token went out more than once"
                assert ops.count("join") == 1 and ops.count("rejoin") >= 2 and ops.count("challenge") >= 2
            assert len(session.members) == 2
    finally:
        server.close()

"""A real rendezvous server on loopback with real endpoints: one signed join each, re-joins prove the key."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from kafila.net import wire
from kafila.net.endpoint import PeerEndpoint
from kafila.net.udp import SOCKET_BUFFER
from rendezvous.core import Addr, RendezvousCore
from rendezvous.server import RendezvousServer
from tests.rendezvous.inprocess import start_on_free_pair

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


class Watched:
    """An in-process rendezvous that records each datagram and wakes a waiter when its condition holds."""

    def __init__(self, server: RendezvousServer) -> None:
        self.server = server
        self.seen: list[tuple[bytes, Addr]] = []
        self._waits: list[tuple[Callable[[RendezvousCore], bool], asyncio.Event]] = []
        original = server.dispatch

        def recording(data: bytes, src: Addr, local: Addr) -> None:
            self.seen.append((data, src))
            original(data, src, local)
            for cond, ev in self._waits:
                if server.core is not None and cond(server.core):
                    ev.set()

        server.dispatch = recording  # type: ignore[method-assign]

    @property
    def core(self) -> RendezvousCore:
        assert self.server.core is not None
        return self.server.core

    async def until(self, cond: Callable[[RendezvousCore], bool], timeout_s: float = 20.0) -> None:
        ev = asyncio.Event()
        if self.server.core is not None and cond(self.server.core):
            return
        self._waits.append((cond, ev))
        async with asyncio.timeout(timeout_s):
            await ev.wait()

    def ops_from(self, src: Addr) -> list[object]:
        return [wire.decode(d).body.get("op") for d, s in self.seen  # type: ignore[union-attr]
                if s == src and wire.kind_of(d) == "kafila"]


@asynccontextmanager
async def rendezvous() -> AsyncIterator[tuple[Addr, Watched]]:
    """A watched rendezvous in this process on a free port pair (bound with retries: a pair found free can be taken)."""
    watched: list[Watched] = []

    def watched_server(port: int) -> RendezvousServer:
        server = RendezvousServer("127.0.0.1", port)
        watched.append(Watched(server))
        return server

    server = await start_on_free_pair(watched_server)
    try:
        yield ("127.0.0.1", server.port), watched[-1]
    finally:
        server.close()


async def test_members_join_once_and_rejoin_with_their_key() -> None:
    async with rendezvous() as (rdv, w), \
            PeerEndpoint(bind=("127.0.0.1", 0), name="a", rendezvous_ping_s=0.05) as a, \
            PeerEndpoint(bind=("127.0.0.1", 0), name="b", rendezvous_ping_s=0.05) as b:
        code = await a.create_session(rdv)
        await b.join_session(rdv, code)
        await w.until(lambda core: core.stats.rejoins >= 6)  # both members have re-joined a few times
        session = w.core.sessions[code.session_id]
        for ep in (a, b):
            m = session.members[ep.member_id]
            assert m.addr == ep.local_addr and m.reg_key == ep.rdv.reg_key
        for ep in (a, b):  # the secret never crosses the network, and nothing a join sends can be used again
            assert not any(code.secret.encode() in d for d, src in w.seen if src == ep.local_addr)
            ops = w.ops_from(ep.local_addr)
            assert ops.count("join") == 1 and ops.count("rejoin") >= 2 and ops.count("challenge") >= 2
        assert len(session.members) == 2


async def test_a_member_the_rendezvous_forgot_registers_again() -> None:
    async with rendezvous() as (rdv, w), \
            PeerEndpoint(bind=("127.0.0.1", 0), name="a", rendezvous_ping_s=0.05) as a:
        code = await a.create_session(rdv)
        first_key = a.rdv.reg_key
        w.core.table.remove(code.session_id, a.member_id)  # as after a suspend longer than its member timeout
        await w.until(lambda core: a.member_id in core.sessions[code.session_id].members)
        m = w.core.sessions[code.session_id].members[a.member_id]
        assert m.addr == a.local_addr and m.reg_key != first_key
        await w.until(lambda core: core.stats.rejoins >= 2)  # and it re-joins with the new key
        assert a.rdv.reg_key == m.reg_key and w.ops_from(a.local_addr).count("join") == 2


async def test_a_member_publishes_its_announcement_again_once_it_is_old(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 34 item 3: what the rendezvous keeps of a member is put right by the member itself, in time
    from kafila.net import rdvclient

    monkeypatch.setattr(rdvclient, "REANNOUNCE_S", 0.2)
    async with rendezvous() as (rdv, w), \
            PeerEndpoint(bind=("127.0.0.1", 0), name="a", rendezvous_ping_s=0.05) as a:
        await a.probe_nat(rdv)
        code = await a.create_session(rdv)
        await a.announce({"bw": 1.0})
        m = w.core.sessions[code.session_id].members[a.member_id]
        mine = m.announcement
        m.announcement = None  # lost (a rendezvous restored from an old state, say)
        await w.until(lambda core: core.sessions[code.session_id].members[a.member_id].announcement == mine)
        assert w.ops_from(a.local_addr).count("announce") >= 2


async def test_its_sockets_have_the_members_buffer_size() -> None:
    """A burst of joins outran the kernel's default 208 KiB receive buffer (datagrams lost, a probe unanswered):
    every socket asks for the members' size, as far as net.core.[rw]mem_max lets it (Linux reports twice what
    it grants)."""
    server = await start_on_free_pair(lambda port: RendezvousServer("127.0.0.1", port))
    try:
        for option, cap in ((socket.SO_RCVBUF, "rmem_max"), (socket.SO_SNDBUF, "wmem_max")):
            granted = 2 * min(SOCKET_BUFFER, int(Path(f"/proc/sys/net/core/{cap}").read_text()))
            for sock in server._sockets.values():
                assert sock.transport is not None
                assert sock.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, option) == granted
    finally:
        server.close()

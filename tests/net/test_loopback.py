"""Real sockets on loopback: members, a real rendezvous (subprocess or in-process), QUIC links."""

from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from kafila.errors import NetworkError, RendezvousBusy, SessionError, UnknownSession, WrongJoinCode
from kafila.net import trust, wire
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import SEND_BUFFER_HIGH, Identity, unacked_bytes
from rendezvous.core import Limits, RendezvousCore
from rendezvous.server import RendezvousServer
from tests.rendezvous.inprocess import start_on_free_pair

pytestmark = [pytest.mark.fast, pytest.mark.timeout(90)]
Addr = tuple[str, int]


@asynccontextmanager
async def two_members(rdv: Addr, **kw: object) -> AsyncIterator[tuple[PeerEndpoint, PeerEndpoint]]:
    """A host and a member, both probed, in one session, announced, each seeing the other verified."""
    async with PeerEndpoint(bind=("127.0.0.1", 0), name="host", **kw) as a, \
            PeerEndpoint(bind=("127.0.0.1", 0), name="member", **kw) as b:  # type: ignore[arg-type]
        await asyncio.gather(a.probe_nat(rdv), b.probe_nat(rdv))
        code = await a.create_session(rdv)
        await b.join_session(rdv, str(code))
        await asyncio.gather(a.announce({"bw": 1.0}), b.announce({"bw": 2.0}))
        await asyncio.gather(a.wait_for_members(2, 10), b.wait_for_members(2, 10))
        yield a, b


def other(ep: PeerEndpoint, member_id: bytes) -> trust.VerifiedMember:
    return ep.peers[member_id]


@pytest.mark.slow
async def test_two_members_direct_link_carries_multi_megabyte_messages(rendezvous_proc) -> None:
    rdv, _ = rendezvous_proc
    async with two_members(rdv) as (a, b):
        assert a.nat_report is not None and a.nat_report.nat_class.value == "permissive"  # loopback: no NAT
        assert a.nat_report.rendezvous_alt_ip == "127.0.0.2"
        ml = await a.members()
        assert {m.name for m in ml.verified} == {"host", "member"} and not ml.rejected
        link, rep = await a.verify_edge(other(a, b.member_id))
        assert link is not None and rep.predicted == "direct" and rep.actual == "direct"
        assert rep.ready_ms is not None  # how fast: `kafila bench nat` reports it (no wall-clock bound here)
        incoming = await b.accept(5)
        assert incoming.peer.member_id == a.member_id
        big = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # 6 MiB, e.g. a stage file chunk
        await link.send(b"small")
        await link.send(big)
        assert await incoming.recv(10) == b"small"
        assert await incoming.recv(60) == big
        await incoming.send(big[::-1])
        assert await link.recv(60) == big[::-1]
        await link.close()
        with pytest.raises(NetworkError, match="closed"):
            await incoming.recv(5)


@pytest.mark.slow
async def test_wrong_join_code_is_refused(rendezvous_proc) -> None:
    rdv, _ = rendezvous_proc
    async with PeerEndpoint(bind=("127.0.0.1", 0)) as a, PeerEndpoint(bind=("127.0.0.1", 0)) as b:
        code = await a.create_session(rdv)
        wrong = trust.JoinCode(code.session_id, trust.JoinCode.new_secret())
        with pytest.raises(WrongJoinCode):
            await b.join_session(rdv, str(wrong))
        with pytest.raises(UnknownSession):
            await b.join_session(rdv, str(trust.JoinCode("zzzzzzzz", code.secret)))
        with pytest.raises(SessionError, match="malformed"):
            await b.join_session(rdv, "not-a-code")


async def test_unreachable_rendezvous_is_a_network_error() -> None:
    # a socket of our own that never answers: a port merely found free could be taken and answered meanwhile
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        async with PeerEndpoint(bind=("127.0.0.1", 0)) as a:
            a.rendezvous = silent.getsockname()
            with pytest.raises(NetworkError, match="did not answer"):
                await a.rdv.request({"op": "ping"}, timeout_s=0.05, tries=3)


@asynccontextmanager
async def inprocess_rendezvous(core_factory=RendezvousCore) -> AsyncIterator[tuple[Addr, RendezvousServer, list]]:
    """A rendezvous in this process, recording every datagram it handles.

    It needs two ports (P, P+1), so it cannot ask for any free one: a pair found free is bound
    with retries, since another process can take it in between.
    """
    seen: list[bytes] = []

    def recording_server(port: int) -> RendezvousServer:
        server = RendezvousServer("127.0.0.1", port, core_factory=core_factory)
        original = server.dispatch

        def recording(data: bytes, src: Addr, local: Addr) -> None:
            seen.append(data)
            original(data, src, local)

        server.dispatch = recording  # type: ignore[method-assign]
        return server

    server = await start_on_free_pair(recording_server)
    port = server.port
    try:
        yield ("127.0.0.1", port), server, seen
    finally:
        server.close()


async def test_relay_carries_only_ciphertext() -> None:
    marker = b"KAFILA-PLAINTEXT-MARKER-0123456789"
    async with inprocess_rendezvous() as (rdv, server, seen):
        async with two_members(rdv, allow_direct=False) as (a, b):
            link = await a.connect(other(a, b.member_id))
            incoming = await b.accept(5)
            assert link.path == "relay" and incoming.path == "relay"
            for _ in range(20):
                await link.send(marker * 30)
                assert await incoming.recv(10) == marker * 30
            await incoming.send(marker)
            assert await link.recv(10) == marker
        assert server.core is not None and server.core.stats.relayed > 20
        relayed = [d for d in seen if d[:1] == bytes([wire.RELAY])]
        assert len(relayed) > 20
        assert not any(marker in d or marker[:12] in d for d in seen), "the relay saw plaintext"


async def test_peer_gone_is_a_network_error_in_bounded_time() -> None:
    async with inprocess_rendezvous() as (rdv, _, _):
        async with two_members(rdv, allow_direct=False, idle_timeout_s=1.5, keepalive_s=0.3) as (a, b):
            link = await a.connect(other(a, b.member_id))
            incoming = await b.accept(5)
            assert b._socket is not None
            b._socket.close()  # b vanishes without a word
            # QUIC's idle timeout (1.5 s) ends the link: a NetworkError, not recv's own 30 s TimeoutError
            with pytest.raises(NetworkError):
                await link.recv(30)
            del incoming


class HostileCore(RendezvousCore):
    """A rendezvous that lists a member of its own and alters a real member's announcement."""

    def _op_list(self, body, src, local, now):  # type: ignore[no-untyped-def]
        reply = super()._op_list(body, src, local, now)
        members = reply["members"]
        for m in members:
            if m["id"] != body["member"]:  # tamper with everyone but the asker
                raw = bytearray(base64.b64decode(m["ann"]))
                raw[40] ^= 0x01  # it cannot read a sealed announcement (to swap its fingerprint): it alters it blindly
                m["ann"] = base64.b64encode(bytes(raw)).decode()
        # Its own member goes on a page of its own, past the real ones: a page full of sealed
        # announcements has no room left in the datagram.
        reply["total"] += 1
        if not members:
            fake = trust.Announcement(body["session"], b"\xee" * 8, "mallory", Identity("mallory").fingerprint,
                                      "permissive", ("127.0.0.1", 9), None, 1.0, {}, trust.now_wall())
            guess = trust.JoinCode(body["session"], trust.JoinCode.new_secret())  # it never saw the secret
            members.append({"id": (b"\xee" * 8).hex(), "ann": fake.seal(guess), "obs": ["127.0.0.1", 9]})
        return reply


async def test_hostile_rendezvous_cannot_add_members_or_swap_fingerprints() -> None:
    async with inprocess_rendezvous(HostileCore) as (rdv, _, _):
        async with PeerEndpoint(bind=("127.0.0.1", 0), name="a") as a, \
                PeerEndpoint(bind=("127.0.0.1", 0), name="b") as b:
            await asyncio.gather(a.probe_nat(rdv), b.probe_nat(rdv))
            code = await a.create_session(rdv)
            await b.join_session(rdv, code)
            await asyncio.gather(a.announce(), b.announce())
            ml = await a.members()
            assert [m.name for m in ml.verified] == ["a"]  # only itself: b was tampered with, mallory forged
            reasons = dict(ml.rejected)
            assert b.member_id.hex()[:8] in reasons and "MAC" in reasons[b.member_id.hex()[:8]]
            assert "eeeeeeee" in reasons and "MAC" in reasons["eeeeeeee"]
            assert b.member_id not in a.peers and b"\xee" * 8 not in a.peers
            # connecting to the forged member is refused outright
            forged = trust.VerifiedMember(b"\xee" * 8, "mallory", b"\0" * 32, a.me.nat_class, None, None, None,  # type: ignore[union-attr]
                                          None, {})
            with pytest.raises(SessionError, match="not a verified member"):
                await a.connect(forged)


async def test_pinning_refuses_a_peer_with_another_certificate() -> None:
    async with inprocess_rendezvous() as (rdv, _, _):
        async with two_members(rdv) as (a, b):
            real = other(a, b.member_id)
            # as if someone in the middle answered for b: the certificate it shows is not the pinned one
            a.peers[b.member_id] = trust.VerifiedMember(real.member_id, real.name, Identity("x").fingerprint,
                                                        real.nat_class, real.mapped, real.local, real.observed,
                                                        real.rtt_ms, real.measurements)
            with pytest.raises(NetworkError, match="pins"):
                await a.connect(a.peers[b.member_id], timeout_s=5)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_load_50_sessions_of_5_members(rendezvous_proc) -> None:
    """250 members in 50 sessions at once, while probes go on: every member sees its 5, every probe is answered.

    No wall-clock bound (how fast is `kafila bench`'s job; on a loaded machine the members' own loop
    is the slow part): a probe may take three tries of 2 s. The bound on the rendezvous' memory growth stays, since
    memory does not depend on the machine's load: 250 members' records are far below 40 MB, so only a
    leak can pass it.
    """
    rdv, proc = rendezvous_proc

    def rss_kb(p: subprocess.Popen[str]) -> int:
        with open(f"/proc/{p.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    rss0 = rss_kb(proc)
    answered = [0]
    stop = asyncio.Event()

    async def prober(ep: PeerEndpoint) -> None:
        while not stop.is_set():
            # sent up to 3 times, as a STUN client does: on a machine whose net.core.rmem_max is the kernel's
            # default, a burst of joins can still overflow the rendezvous's socket buffer, and UDP drops
            ans = await ep.rdv.stun_request(rdv, 0, 2.0, 3)
            assert ans is not None, "the rendezvous stopped answering probes under load (3 tries in 6 s)"
            answered[0] += 1
            await asyncio.sleep(0.05)

    async def session(i: int) -> int:
        async with PeerEndpoint(bind=("127.0.0.1", 0), name=f"h{i}") as host:
            await host.probe_nat(rdv)
            code = await host.create_session(rdv)
            await host.announce()

            # A member that has seen all 5 stays until the others have too: leaving (as its endpoint
            # closes) takes it off the list, and a slower member then never saw 5 (1 run in 20).
            everyone_saw_all = asyncio.Barrier(4)

            async def member(j: int) -> int:
                async with PeerEndpoint(bind=("127.0.0.1", 0), name=f"m{i}.{j}") as m:
                    await m.probe_nat(rdv)
                    await m.join_session(rdv, code)
                    await m.announce({"j": j})
                    seen = len((await m.wait_for_members(5, 300, poll_s=0.5)).verified)
                    await everyone_saw_all.wait()
                    return seen

            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(member(j)) for j in range(4)]
            return min(t.result() for t in tasks)

    async with PeerEndpoint(bind=("127.0.0.1", 0)) as watcher:
        async with asyncio.TaskGroup() as tg:
            probe_task = tg.create_task(prober(watcher))
            results = await asyncio.gather(*(session(i) for i in range(50)))
            stop.set()
            await probe_task
    assert results == [5] * 50
    assert answered[0] > 0
    assert rss_kb(proc) - rss0 < 40_000, "rendezvous memory grew by more than 40 MB"


async def test_limits_bound_the_member_count() -> None:
    async with inprocess_rendezvous(lambda socks, _l: RendezvousCore(socks, Limits(max_members=2))) as (rdv, _, _):
        eps = [PeerEndpoint(bind=("127.0.0.1", 0)) for _ in range(3)]
        async with eps[0] as a, eps[1] as b, eps[2] as c:
            code = await a.create_session(rdv)
            await b.join_session(rdv, code)
            with pytest.raises(RendezvousBusy):
                await c.join_session(rdv, code)


async def test_ring_of_three_opens_exactly_its_edges() -> None:
    async with inprocess_rendezvous() as (rdv, _, _):
        eps = [PeerEndpoint(bind=("127.0.0.1", 0), name=f"m{i}") for i in range(3)]
        async with eps[0] as a, eps[1] as b, eps[2] as c:
            await asyncio.gather(*(e.probe_nat(rdv) for e in (a, b, c)))
            code = await a.create_session(rdv)
            await asyncio.gather(b.join_session(rdv, code), c.join_session(rdv, code))
            await asyncio.gather(*(e.announce() for e in (a, b, c)))
            mls = await asyncio.gather(*(e.wait_for_members(3, 10) for e in (a, b, c)))
            order = sorted(mls[0].verified, key=lambda m: m.name)
            rings = await asyncio.gather(*(e.open_ring(order) for e in (a, b, c)))
            for e, ring in zip((a, b, c), rings, strict=True):
                assert ring.next is not None and ring.prev is not None and ring.report is not None
                assert ring.report.actual in ("direct", "relay") and ring.report.ready_ms is not None
                assert len(e._links) == 2  # exactly two edges per member
            # a token goes round the ring: a -> b -> c -> a
            await rings[0].next.send(b"token")  # type: ignore[union-attr]
            for i in (1, 2):
                msg = await rings[i].prev.recv(5)  # type: ignore[union-attr]
                await rings[i].next.send(msg + bytes([i]))  # type: ignore[union-attr]
            assert await rings[0].prev.recv(5) == b"token\x01\x02"  # type: ignore[union-attr]


async def answer_one_request(sock: socket.socket) -> None:
    """Play the rendezvous for one request: read datagrams until a REQUEST, answer it ok."""
    loop = asyncio.get_running_loop()
    while True:
        data, addr = await loop.sock_recvfrom(sock, 2048)
        frame = wire.decode(data) if data[:1] == bytes([wire.REQUEST]) else None
        if isinstance(frame, wire.Control):
            await loop.sock_sendto(sock, wire.encode_control(wire.RESPONSE, frame.request_id, {"ok": True}), addr)
            return


async def test_endpoint_survives_garbage_datagrams() -> None:
    import random

    rng = random.Random(4)
    # two real sockets send the garbage: one the endpoint takes for its rendezvous, one a stranger
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as fake_rdv, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        for s in (fake_rdv, stranger):
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
        async with PeerEndpoint(bind=("127.0.0.1", 0)) as ep:
            ep.rendezvous = fake_rdv.getsockname()  # half the garbage comes from the rendezvous's address
            for i in range(3000):
                first = rng.choice([0x00, 0x01, 0x10, 0x11, 0x20, 0x21, 0x30, 0x31, 0x32, 0x40, 0xC0,
                                    rng.randrange(256)])
                data = bytes([first]) + rng.randbytes(rng.randrange(0, 1400))
                if first == 0x21 and rng.random() < 0.5:  # a relayed QUIC Initial-looking payload
                    data = bytes([0x21]) + rng.randbytes(8) + bytes([0xC3]) + rng.randbytes(1250)
                (fake_rdv if rng.random() < 0.5 else stranger).sendto(data, ep.local_addr)
                if i % 100 == 99:  # a round trip through the endpoint: it has read all sent before
                    answer = asyncio.ensure_future(answer_one_request(fake_rdv))
                    await ep.rdv.request({"op": "ping"}, timeout_s=1.0, tries=5)
                    await answer
            assert not ep._ticker_task.done()


async def test_send_waits_for_acknowledgements_without_polling() -> None:
    """A message larger than the send buffer's high mark: send() returns once the peer acknowledged enough."""
    async with inprocess_rendezvous() as (rdv, _, _):
        async with two_members(rdv) as (a, b):
            link = await a.connect(other(a, b.member_id))
            incoming = await b.accept(5)
            big = bytes(range(256)) * (12 * 1024 * 1024 // 256)  # 12 MiB: past SEND_BUFFER_HIGH (8 MiB)
            receiving = asyncio.ensure_future(incoming.recv(120))
            async with asyncio.timeout(120):
                await link.send(big)
            assert unacked_bytes(link.conn) <= SEND_BUFFER_HIGH and not link.blocked
            assert await receiving == big


async def test_post_queues_past_the_high_mark_at_once_and_in_order() -> None:
    """post() (a goodbye) does not wait on acknowledgements, even with more than the high mark unacknowledged."""
    async with inprocess_rendezvous() as (rdv, _, _):
        async with two_members(rdv) as (a, b):
            link = await a.connect(other(a, b.member_id))
            incoming = await b.accept(5)
            big = bytes(range(256)) * (12 * 1024 * 1024 // 256)
            link.post(big)
            link.post(b"bye")
            assert unacked_bytes(link.conn) > SEND_BUFFER_HIGH  # a send() would be waiting here
            async with asyncio.timeout(120):
                assert await incoming.recv() == big and await incoming.recv() == b"bye"


async def test_recv_reads_what_arrived_before_the_end_shares_messages_and_times_out() -> None:
    """A link's recv(): concurrent readers each get one message, a timeout is a TimeoutError, and messages that
    arrived before the peer closed are read before the NetworkError."""
    async with inprocess_rendezvous() as (rdv, _, _):
        async with two_members(rdv) as (a, b):
            link = await a.connect(other(a, b.member_id))
            incoming = await b.accept()
            with pytest.raises(TimeoutError, match="no message"):
                await incoming.recv(timeout=0.2)
            readers = [asyncio.ensure_future(incoming.recv(timeout=10)) for _ in range(2)]
            await asyncio.sleep(0)  # both wait before anything arrives
            await link.send(b"one")
            await link.send(b"two")
            assert sorted(await asyncio.gather(*readers)) == [b"one", b"two"]
            for m in (b"three", b"four"):
                await link.send(m)
            while len(incoming._inbox) < 2:  # both arrived
                await asyncio.sleep(0.01)
            await link.close()
            while incoming.closed is None:
                await asyncio.sleep(0.01)
            assert [await incoming.recv(), await incoming.recv()] == [b"three", b"four"]
            with pytest.raises(NetworkError, match="closed"):
                await incoming.recv(timeout=5)
            assert incoming._waiters == []

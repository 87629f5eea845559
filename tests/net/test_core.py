"""The endpoint core without sockets: in-memory members and the real rendezvous (RendezvousCore, in-process) on a
fake clock, with loss and reordering."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioquic.quic.connection import QuicConnection

from kafila.net import events as ev
from kafila.net import registration, wire
from kafila.net.core import CoreConfig, EndpointCore
from kafila.net.punch import PunchConfig
from kafila.net.quic import Identity, PinnedQuicConnection, configuration
from kafila.net.trust import JoinCode, VerifiedMember
from kafila.planner.reachability import NatClass
from rendezvous.core import RendezvousCore
from tests.rendezvous.asking import answer

pytestmark = pytest.mark.fast

Addr = tuple[str, int]
RELAY: Addr = ("10.9.9.9", 3478)  # the rendezvous: probe responder, session registry and relay
SECRET = "0123456789abcdef"  # the join code's secret (the session id is the rendezvous's to give)
Made = Callable[[bytes], dict[str, Any]]  # a request made for the cookie it goes with


@dataclass
class Member:
    """One core at an address, and what it has received on its connections."""

    addr: Addr
    core: EndpointCore
    name: str
    received: dict[PinnedQuicConnection, bytearray] = field(default_factory=dict)
    done: set[PinnedQuicConnection] = field(default_factory=set)  # handshake completed
    ended: dict[PinnedQuicConnection, str] = field(default_factory=dict)
    paths: list[ev.PathChanged] = field(default_factory=list)
    rendezvous: list[ev.RendezvousLost | ev.RendezvousBack] = field(default_factory=list)
    rejoins: int = 0  # RejoinDue events seen
    reg_key: bytes | None = None  # from the member's latest join, as the rendezvous issued it
    cookie: bytes = bytes(registration.COOKIE_LEN)  # the rendezvous's latest for its address (none yet: zeros)


class Net:
    """Datagrams between members and the rendezvous, delivered after a delay; maybe lost, maybe reordered.

    The rendezvous is the real RendezvousCore: members create and join a session with it, re-join it when their
    core says so (challenge and MAC'd rejoin, registering afresh when it forgot them, creating the session again
    under its id when it forgot that, as kafila.net.rdvclient does), and it relays only between members of one
    session, within its rate and size bounds. Its clock is the net's."""

    def __init__(self, seed: int = 1, loss: float = 0.0, jitter_s: float = 0.0, delay_s: float = 0.01) -> None:
        self.rng = random.Random(seed)
        self.loss, self.jitter_s, self.delay_s = loss, jitter_s, delay_s
        self.now = 0.0
        self.rendezvous = RendezvousCore([RELAY])
        self.relay_alive = True  # False: the rendezvous is down (nothing reaches it, nothing comes from it)
        self.code: JoinCode | None = None  # once the session is created
        self.members: dict[Addr, Member] = {}
        self.blocked: Callable[[Addr, Addr], bool] = lambda src, dst: False  # a filter on direct datagrams
        self._queue: list[tuple[float, int, Addr, Addr, bytes]] = []
        self._seq = 0
        self._asked: dict[int, tuple[Member, dict[str, Any] | Made]] = {}  # request id -> who asked what
        self.direct_sent = 0
        self.log: list[tuple[Addr, Addr, bytes]] = []  # every datagram sent: (src, dst, data)

    def add(self, name: str, addr: Addr, config: CoreConfig | None = None) -> Member:
        mid = name.encode().ljust(8, b"-")[:8]
        core = EndpointCore(mid, Identity(name), config or CoreConfig(), PunchConfig(window_s=2.0))
        core.rendezvous = RELAY  # as PeerEndpoint sets it before it creates or joins: its answers are let in
        m = Member(addr, core, name)
        self.members[addr] = m
        return m

    def introduce(self) -> None:
        """Every member lists every other (as a verified member list would); the first creates the session; all
        join it."""
        for m in self.members.values():
            for o in self.members.values():
                if o is not m:
                    m.core.peers[o.core.member_id] = VerifiedMember(
                        o.core.member_id, o.name, o.core.identity.fingerprint, NatClass.PERMISSIVE, o.addr, None,
                        o.addr, 1.0, {}, punch_public=o.core.identity.punch_public)
        if self.code is None:
            self._at_once(next(iter(self.members.values())), self._create())
        for m in self.members.values():
            if m.reg_key is None:
                self._at_once(m, self._join(m))
        assert self.code is not None and all(m.reg_key is not None for m in self.members.values())
        for m in self.members.values():
            m.core.joined(RELAY, self.code.punch_key, self.now)

    def _at_once(self, m: Member, make: Made) -> None:
        """A request of the setup, answered before the clock moves: the rendezvous's answer straight to m's core
        (the tests' timelines start with everyone registered, as they did with a relay that needed no joins)."""
        _, told = answer(self.rendezvous, registration.cookie_body(), m.addr, RELAY, self.now, 0)  # as rdvclient
        assert told is not None and told["ok"], told
        m.cookie = bytes.fromhex(told["cookie"])
        body = make(m.cookie)
        self._seq += 1
        self._asked[self._seq] = (m, body)
        for out, via, to in self.rendezvous.handle(wire.encode_control(wire.REQUEST, self._seq, body), m.addr,
                                                   RELAY, self.now):
            self.members[to].core.receive_datagram(out, via, self.now)
        self._flush()  # where the core hands the answer on

    # ---- the member's side of the registration (kafila.net.rdvclient's, on the fake clock) -----------------

    def _create(self, again: bool = False) -> Made:
        join_pub = JoinCode("00000000", SECRET).join_public.hex()  # the join key is not bound to the id
        return lambda cookie: {"op": "create", "join_pub": join_pub, **({"session": self._sid} if again else {}),
                               "cookie": cookie.hex()}

    @property
    def _sid(self) -> str:
        assert self.code is not None
        return self.code.session_id

    def _join(self, m: Member) -> Made:
        code = self.code
        assert code is not None
        mid = m.core.member_id
        return lambda cookie: {**registration.join_body(code.session_id, mid, code.join_proof(mid, cookie)),
                               "cookie": cookie.hex()}

    def _ask(self, m: Member, body: dict[str, Any] | Made) -> None:
        """Send one request from m to the rendezvous (lost, its answer never comes: the next re-join asks again);
        one made for a cookie goes with m's latest."""
        self._seq += 1
        self._asked[self._seq] = (m, body)
        sent = body(m.cookie) if callable(body) else body
        self.send(m.addr, RELAY, wire.encode_control(wire.REQUEST, self._seq, sent))

    def _rejoin(self, m: Member) -> None:
        """A RejoinDue: challenge, then a MAC'd rejoin (a member never registered joins)."""
        if self.code is not None:
            if m.reg_key is None:
                self._ask(m, self._join(m))
            else:
                self._ask(m, registration.challenge_body(self._sid, m.core.member_id))

    def _answered(self, rid: int, reply: dict[str, Any]) -> None:
        asked = self._asked.pop(rid, None)
        if asked is None:
            return  # an answer to a request already answered
        m, body = asked
        op = (body(m.cookie) if callable(body) else body)["op"]
        if reply.get("ok") is not True:  # forgotten by the rendezvous: register afresh, or create the session again
            if reply.get("code") == "cookie":
                m.cookie = bytes.fromhex(reply["cookie"])
                self._ask(m, body)
            elif op in ("challenge", "rejoin") and reply.get("code") == "not_member":
                self._ask(m, self._join(m))
            elif op in ("challenge", "rejoin") and reply.get("code") == "unknown_session":
                self._ask(m, self._create(again=True))
            return  # anything else: the next re-join tries again
        if op == "create" and self.code is None:
            self.code = JoinCode(wire.get_str(reply, "session", 8), SECRET)
        elif op == "create":  # created again (by us or by another member first): join it
            self._ask(m, self._join(m))
        elif op == "join":
            m.reg_key = registration.reg_key_of(reply)
        elif op == "challenge":
            assert m.reg_key is not None
            nonce = wire.get_hex(reply, "nonce", registration.NONCE_LEN)
            self._ask(m, registration.rejoin_body(self._sid, m.core.member_id, m.reg_key, nonce))

    # ---- the network ---------------------------------------------------------------------------------

    def send(self, src: Addr, dst: Addr, data: bytes) -> None:
        self.log.append((src, dst, data))
        if dst != RELAY and src != RELAY:
            self.direct_sent += 1
            if self.blocked(src, dst):
                return
        if self.rng.random() < self.loss:
            return
        at = self.now + self.delay_s + self.rng.random() * self.jitter_s  # jitter reorders
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, src, dst, data))

    def _flush(self) -> None:
        for m in self.members.values():
            for data, dst in m.core.datagrams_to_send(self.now):
                self.send(m.addr, dst, data)
            while (e := m.core.next_event()) is not None:
                if isinstance(e, ev.HandshakeCompleted):
                    assert e.conn.pin_error() is None
                    m.done.add(e.conn)
                elif isinstance(e, ev.StreamData):
                    m.received.setdefault(e.conn, bytearray()).extend(e.data)
                elif isinstance(e, ev.ConnectionEnded):
                    m.ended[e.conn] = e.reason
                elif isinstance(e, ev.PathChanged):
                    m.paths.append(e)
                elif isinstance(e, ev.RendezvousLost | ev.RendezvousBack):
                    m.rendezvous.append(e)
                elif isinstance(e, ev.RejoinDue):
                    m.rejoins += 1
                    self._rejoin(m)
                elif isinstance(e, ev.ControlReceived):
                    self._answered(e.request_id, e.body)
            for data, dst in m.core.datagrams_to_send(self.now):  # what acting on events queued
                self.send(m.addr, dst, data)

    def run(self, until: Callable[[], bool], limit_s: float) -> bool:
        """Advance the clock event by event until `until()` holds (True) or limit_s passes (False)."""
        end = self.now + limit_s
        while True:
            self._flush()
            if until():
                return True
            timers = [t for m in self.members.values() if (t := m.core.get_timer()) is not None]
            nxt = min([*timers, self._queue[0][0] if self._queue else end, end])
            if nxt >= end:
                self.now = end
                return until()
            # a hair past the due time: aioquic's loss timer computed as sent + delay can fall a rounding
            # error short of its own `sent <= now - delay` test, and would fire again and again at one instant
            self.now = max(self.now, nxt) + 1e-6
            while self._queue and self._queue[0][0] <= self.now:
                _, _, src, dst, data = heapq.heappop(self._queue)
                if RELAY in (src, dst) and not self.relay_alive:
                    continue
                if dst == RELAY:
                    for out, via, to in self.rendezvous.handle(data, src, RELAY, self.now):
                        self.send(via, to, out)
                elif dst in self.members:
                    self.members[dst].core.receive_datagram(data, src, self.now)
            for m in self.members.values():
                t = m.core.get_timer()
                if t is not None and t <= self.now:
                    m.core.handle_timer(self.now)


def pair(net: Net, **kw: object) -> tuple[Member, Member]:
    a = net.add("alice", ("10.0.0.1", 1000), CoreConfig(**kw))  # type: ignore[arg-type]
    b = net.add("bob", ("10.0.0.2", 2000), CoreConfig(**kw))  # type: ignore[arg-type]
    net.introduce()
    return a, b


def open_link(net: Net, a: Member, b: Member, limit_s: float = 10.0) -> tuple[PinnedQuicConnection,
                                                                              PinnedQuicConnection]:
    """a connects to b; both ends' handshakes complete (pins checked in Net._flush)."""
    conn = a.core.connect(a.core.peers[b.core.member_id], net.now)
    assert net.run(lambda: conn in a.done and len(b.done) == 1, limit_s), "handshake did not complete"
    (incoming,) = b.done
    assert incoming.peer.member_id == a.core.member_id
    return conn, incoming


def transfer(net: Net, src: Member, conn: PinnedQuicConnection, dst: Member, dconn: PinnedQuicConnection,
             payload: bytes, limit_s: float = 30.0) -> None:
    src.core.send_stream(conn, payload)
    before = len(dst.received.get(dconn, b""))
    assert net.run(lambda: len(dst.received.get(dconn, b"")) >= before + len(payload), limit_s), "data stalled"
    assert bytes(dst.received[dconn][before:]) == payload


def test_link_over_the_relay_at_once_then_direct() -> None:
    net = Net()
    a, b = pair(net)
    conn, incoming = open_link(net, a, b)
    assert net.rendezvous.stats.relayed > 0  # the handshake went through the relay while punching began
    assert net.run(lambda: a.core.path_to(b.core.member_id) == b.core.path_to(a.core.member_id) == "direct", 3)
    assert a.core.punch_outcome(b.core.member_id)[0]
    assert [p.after.value for p in a.paths][-1] == "direct"
    relayed = net.rendezvous.stats.relayed
    transfer(net, a, conn, b, incoming, bytes(range(256)) * 256)
    transfer(net, b, incoming, a, conn, b"pong" * 1000)
    assert net.rendezvous.stats.relayed == relayed  # once direct, nothing more goes through the relay


def test_loss_and_reordering_do_not_corrupt_or_stall_a_link() -> None:
    net = Net(seed=7, loss=0.15, jitter_s=0.03)
    a, b = pair(net)
    conn, incoming = open_link(net, a, b, limit_s=30)
    payload = random.Random(3).randbytes(200_000)
    transfer(net, a, conn, b, incoming, payload, limit_s=60)
    transfer(net, b, incoming, a, conn, payload[::-1], limit_s=60)


def test_blocked_direct_path_stays_on_the_relay() -> None:
    net = Net(seed=2)
    a, b = pair(net)
    net.blocked = lambda src, dst: True  # no direct datagram ever arrives: symmetric NATs on both sides
    conn, incoming = open_link(net, a, b)
    assert net.run(lambda: a.core.punch_outcome(b.core.member_id)[0], 5)
    assert a.core.path_to(b.core.member_id) == "relay" and net.direct_sent > 0
    transfer(net, a, conn, b, incoming, b"x" * 50_000)


def test_three_members_each_reach_the_others() -> None:
    net = Net(seed=5, jitter_s=0.005)
    a = net.add("alice", ("10.0.0.1", 1000))
    b = net.add("bob", ("10.0.0.2", 2000))
    c = net.add("cy", ("10.0.0.3", 3000))
    net.introduce()
    net.blocked = lambda src, dst: "10.0.0.3" in (src[0], dst[0])  # cy is only reachable through the relay
    ab, ba = open_link(net, a, b)
    bc = b.core.connect(b.core.peers[c.core.member_id], net.now)
    assert net.run(lambda: bc in b.done and len(c.done) == 1, 10)
    (cb,) = c.done
    transfer(net, a, ab, b, ba, b"to bob")
    transfer(net, b, bc, c, cb, b"to cy")
    assert net.run(lambda: b.core.punch_outcome(c.core.member_id)[0], 5)
    assert b.core.path_to(c.core.member_id) == "relay" and a.core.path_to(b.core.member_id) == "direct"


def initial_from(identity: Identity, now: float) -> bytes:
    """A real client's first datagram (an Initial with a fresh connection id)."""
    client = QuicConnection(configuration=configuration(identity, True, 10.0))
    client.connect(("peer", 0), now)
    data = client.datagrams_to_send(now)[0][0]
    assert len(data) >= 1200
    return data


def relayed_from(member_id: bytes, payload: bytes) -> bytes:
    return wire.encode_relay(wire.RELAYED, member_id, payload)


def retried_initial(a: Member, bob: Member, now: float) -> bytes:
    """What bob's QUIC sends alice after her Retry of its first Initial: that Initial again, with the token."""
    client = QuicConnection(configuration=configuration(bob.core.identity, True, 10.0))
    client.connect(("peer", 0), now)
    a.core.receive_datagram(relayed_from(bob.core.member_id, client.datagrams_to_send(now)[0][0]), RELAY, now)
    [(retry, _)] = a.core.datagrams_to_send(now)
    client.receive_datagram(wire.decode(retry).payload, ("peer", 0), now)
    return client.datagrams_to_send(now)[0][0]


def test_a_flood_of_initials_takes_no_slot_and_a_real_link_opens_at_once() -> None:
    # issue 34 item 8: Initials from a throwaway client "from" bob took both of bob's handshake slots and held
    # him out 4-5 s at a time; now each is answered with a Retry that goes to bob, and creates nothing
    net = Net(seed=3)
    a = net.add("alice", ("10.0.0.1", 1000), CoreConfig(idle_timeout_s=3.0))
    b = net.add("bob", ("10.0.0.2", 2000))
    net.introduce()
    bob = b.core.member_id
    for _ in range(100):  # valid Initials, each with a fresh connection id, as if from bob (via the relay)
        a.core.receive_datagram(relayed_from(bob, initial_from(b.core.identity, net.now)), RELAY, net.now)
    assert a.core.connections == []
    retries = [d for d, dst in a.core.datagrams_to_send(net.now)]
    assert len(retries) == 100 and all(d[0] == wire.RELAY and d[1:9] == bob for d in retries)  # all to bob
    stranger = b"\x99" * 8  # an id nobody listed: its Initials create nothing, and get no Retry either
    for _ in range(20):
        a.core.receive_datagram(relayed_from(stranger, initial_from(Identity("x"), net.now)), RELAY, net.now)
    assert a.core.connections == [] and a.core.datagrams_to_send(net.now) == []
    conn, incoming = open_link(net, b, a, limit_s=1)  # nothing held: bob's link opens within its first second
    assert incoming in a.done and conn in b.done and a.core.connections == [incoming]


def test_a_token_is_good_only_for_its_member_its_connection_and_ten_seconds() -> None:
    net = Net(seed=5)
    a = net.add("alice", ("10.0.0.1", 1000), CoreConfig(idle_timeout_s=3.0))
    b = net.add("bob", ("10.0.0.2", 2000))
    c = net.add("cy", ("10.0.0.3", 3000))
    net.introduce()
    bob, cy = b.core.member_id, c.core.member_id
    again = retried_initial(a, b, net.now)
    a.core.receive_datagram(relayed_from(cy, again), RELAY, net.now)  # bob's token, "from" cy: dropped
    a.core.receive_datagram(relayed_from(bob, again), RELAY, net.now + 11)  # too late: dropped
    assert a.core.connections == []
    # a member that does receive its Retries still gets no more than its bound of pending handshakes
    for _ in range(10):
        a.core.receive_datagram(relayed_from(bob, retried_initial(a, b, net.now)), RELAY, net.now)
        a.core.datagrams_to_send(net.now)
    assert len(a.core.connections) == a.core.config.max_pending_per_peer == 2


def test_the_retried_first_initial_leaves_nothing_in_flight() -> None:
    # RFC 9002 §6.3; aioquic 1.7.2 kept the Initial its Retry answered in bytes in flight for good, a datagram
    # less congestion window for the connection's life (a shrunk path then crawled instead of falling back)
    net = Net(seed=7)
    a, b = pair(net)
    conn, _ = open_link(net, a, b)
    assert conn._retry_count == 1
    transfer(net, a, conn, b, next(iter(b.done)), b"z" * 20_000)
    assert net.run(lambda: conn._loss.bytes_in_flight == 0, 5), conn._loss.bytes_in_flight


def test_forged_initials_never_take_a_slot() -> None:
    net = Net(seed=4)
    a, b = pair(net)
    bob = b.core.member_id
    real = b.core.connect(b.core.peers[a.core.member_id], net.now)
    for i in range(300):  # Initials whose connection id was changed: nothing in them decrypts
        data = bytearray(initial_from(b.core.identity, net.now))
        data[6:14] = i.to_bytes(8, "big")  # the destination connection id (after flags, version, length)
        a.core.receive_datagram(relayed_from(bob, bytes(data)), RELAY, net.now)
    assert a.core.connections == []
    assert net.run(lambda: real in b.done and len(a.done) == 1, 2)  # the real handshake is not held up


def test_replayed_punch_frames_from_elsewhere_change_nothing_and_send_nothing() -> None:
    net = Net(seed=6)
    a, b = pair(net)
    open_link(net, a, b)
    assert net.run(lambda: a.core.path_to(b.core.member_id) == "direct", 3)
    elsewhere = ("203.0.113.5", 80)
    from_b = [d for src, dst, d in net.log if src == b.addr and dst == a.addr and d[0] in (wire.PUNCH, wire.PUNCH_ACK)]
    assert {d[0] for d in from_b} == {wire.PUNCH, wire.PUNCH_ACK}
    for data in from_b:  # every punch frame bob ever sent alice, replayed with a spoofed source
        a.core.receive_datagram(data, elsewhere, net.now)
    assert [dst for _, dst in a.core.datagrams_to_send(net.now) if dst == elsewhere] == []
    assert a.core.path_to(b.core.member_id) == "direct" and a.paths[-1].direct == b.addr
    assert elsewhere not in a.core._punchers[b.core.member_id].candidates

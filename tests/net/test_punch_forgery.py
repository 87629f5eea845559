"""A member forging punches between two others (issue #56 item 1), on the endpoint cores without sockets (the Net of
test_core: the real RendezvousCore on a fake clock).

Mallory holds the join code and is a member: she knows the session's punch key and her own keys, not alice's or
bob's. She forges punch frames "from alice" to bob from addresses of her own, with every key she has. None may move
bob's path to alice, take a candidate slot of it, or draw a single datagram from bob; the edge between alice and
bob carries data the whole time."""

from __future__ import annotations

import secrets
from dataclasses import replace

import pytest

from kafila.net import trust, wire
from kafila.net.punch import PunchState
from tests.net.test_core import Member, Net, open_link, transfer

pytestmark = pytest.mark.fast

Addr = tuple[str, int]
MALLORY: Addr = ("10.0.0.66", 6600)


def mallory_keys(net: Net, mallory: Member, victim: Member) -> list[bytes]:
    """Every punch key the insider holds toward the victim: the session's, and her own pair key with it."""
    assert net.code is not None
    keys = [net.code.punch_key]
    pair = getattr(trust, "pair_punch_key", None)  # before issue #56, the session's key was the only one
    if pair is not None:
        mine = mallory.core.identity
        keys.append(pair(net.code.punch_key, mallory.core.member_id, mine.punch_private, victim.core.member_id,
                         victim.core.identity.punch_public))
    return keys


def forged(kind: int, sender: Member, receiver: Member, key: bytes, now: float, nonce: bytes | None = None) -> bytes:
    """A punch frame claiming to be from `sender`, MAC'd with `key`, fresh by the clock."""
    stamp = int(now * 1000) + secrets.randbelow(1000)
    n = nonce if nonce is not None else secrets.token_bytes(wire.NONCE_LEN)
    mac = trust.punch_mac(key, kind, sender.core.member_id, receiver.core.member_id, stamp, n)
    return wire.encode_punch(wire.Punch(kind, sender.core.member_id, receiver.core.member_id, stamp, n, mac))


def punches_to(net: Net, src: Addr, dst: Addr, start: int) -> list[wire.Punch]:
    """The PUNCH frames src sent to dst since net.log[start]."""
    out = []
    for s, d, data in net.log[start:]:
        if s == src and d == dst and data[0] == wire.PUNCH:
            frame = wire.decode(data)
            assert isinstance(frame, wire.Punch)
            out.append(frame)
    return out


def sent_to(net: Net, src: Addr, dsts: set[Addr], start: int) -> int:
    """How many datagrams src sent to any of dsts since net.log[start]."""
    return sum(1 for s, d, _ in net.log[start:] if s == src and d in dsts)


def members(net: Net) -> tuple[Member, Member, Member]:
    alice = net.add("alice", ("10.0.0.1", 1000))
    bob = net.add("bob", ("10.0.0.2", 2000))
    mallory = net.add("mallory", MALLORY)
    net.introduce()
    return alice, bob, mallory


def test_a_member_cannot_take_over_the_direct_path_between_two_others() -> None:
    net = Net(seed=11)
    alice, bob, mallory = members(net)
    # alice and bob cannot reach each other directly (restrictive NATs): their edge runs through the relay
    net.blocked = lambda src, dst: {src, dst} == {alice.addr, bob.addr}
    conn, incoming = open_link(net, alice, bob)
    transfer(net, alice, conn, bob, incoming, b"hello")  # the stream is alice's to open
    assert net.run(lambda: bob.core.punch_outcome(alice.core.member_id)[0], 5)
    start = len(net.log)
    for key in mallory_keys(net, mallory, bob):
        net.send(MALLORY, bob.addr, forged(wire.PUNCH, alice, bob, key, net.now))
        net.run(lambda: False, 0.1)
        for p in punches_to(net, bob.addr, MALLORY, start):  # answer every PUNCH bob sent her, echoing its nonce
            net.send(MALLORY, bob.addr, forged(wire.PUNCH_ACK, alice, bob, key, net.now, nonce=p.nonce))
        net.run(lambda: False, 0.1)
    # bob's QUIC packets to alice keep going where they went: the relay, never mallory
    transfer(net, bob, incoming, alice, conn, b"to alice" * 2000)
    net.run(lambda: False, 2.0)
    transfer(net, bob, incoming, alice, conn, b"still to alice" * 2000)
    assert bob.core.path_to(alice.core.member_id) == "relay"
    assert not [p for p in bob.paths if p.member_id == alice.core.member_id and p.after == PunchState.DIRECT]
    assert sent_to(net, bob.addr, {MALLORY}, start) == 0  # not a packet, not even a punch or an ACK
    assert not alice.ended and not bob.ended


def test_junk_punches_cannot_fill_the_candidate_slots() -> None:
    net = Net(seed=12)
    alice, bob, mallory = members(net)
    real = alice.addr
    # alice's announcement names a mapping she no longer has (a symmetric NAT gives her a new one toward bob):
    # bob can learn her real address only from her own punches
    stale: Addr = ("10.0.0.1", 1999)
    bob.core.peers[alice.core.member_id] = replace(bob.core.peers[alice.core.member_id], mapped=stale, observed=stale)
    junk = {(f"10.6.6.{i}", 4000 + i) for i in range(10)}
    start = len(net.log)
    for key in mallory_keys(net, mallory, bob):
        for addr in sorted(junk):  # ten forged punches "from alice", each from an address of mallory's
            net.send(addr, bob.addr, forged(wire.PUNCH, alice, bob, key, net.now))
    net.run(lambda: False, 0.2)
    # alice now connects: bob must still learn, punch and answer her real address
    conn, incoming = open_link(net, alice, bob)
    assert net.run(lambda: bob.core.path_to(alice.core.member_id) == "direct", 5)
    went = [p.direct for p in bob.paths if p.member_id == alice.core.member_id and p.after == PunchState.DIRECT]
    assert went == [real]
    assert sent_to(net, bob.addr, junk, start) == 0  # bob punched, acknowledged nothing at mallory's addresses
    transfer(net, alice, conn, bob, incoming, b"hello")
    transfer(net, bob, incoming, alice, conn, b"direct" * 5000)


class PunchOnlyMiddlebox(Net):
    """A Net with a middlebox at MIDDLE that passes punch frames between two members, both ways, and drops the rest:
    what a hostile rendezvous could place at the address it reports having seen for a member (that address is a
    hint no MAC covers)."""

    MIDDLE: Addr = ("10.0.0.77", 7700)

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.ends: tuple[Addr, Addr] | None = None
        self.dropped = 0  # datagrams other than punches it swallowed

    def send(self, src: Addr, dst: Addr, data: bytes) -> None:
        if dst != self.MIDDLE or self.ends is None or src not in self.ends:
            super().send(src, dst, data)
            return
        self.log.append((src, dst, data))
        if data[0] in (wire.PUNCH, wire.PUNCH_ACK, wire.PUNCH_GO):
            super().send(self.MIDDLE, self.ends[1] if src == self.ends[0] else self.ends[0], data)
        else:
            self.dropped += 1


def test_a_path_that_carries_punches_but_not_quic_is_never_taken() -> None:
    """The punches through the middlebox verify (they are alice's and bob's own), so the punch proposes it; only the
    connection's own path validation (a PATH_CHALLENGE only alice can answer) may move packets there, and it fails."""
    net = PunchOnlyMiddlebox(seed=13)
    alice = net.add("alice", ("10.0.0.1", 1000))
    bob = net.add("bob", ("10.0.0.2", 2000))
    net.introduce()
    net.ends = (alice.addr, bob.addr)
    net.blocked = lambda src, dst: {src, dst} == {alice.addr, bob.addr}  # only the middlebox joins them directly
    bob.core.peers[alice.core.member_id] = replace(bob.core.peers[alice.core.member_id], observed=net.MIDDLE)
    conn, incoming = open_link(net, alice, bob)
    transfer(net, alice, conn, bob, incoming, b"hello")
    net.run(lambda: False, 1.0)
    # the punch itself succeeded through the middlebox: both sides' punchers propose it
    punched = {m.name: m.core._punchers[o.core.member_id].direct for m, o in ((alice, bob), (bob, alice))}
    assert punched == {"alice": net.MIDDLE, "bob": net.MIDDLE}
    for _ in range(3):
        transfer(net, bob, incoming, alice, conn, b"to alice" * 2000)
        transfer(net, alice, conn, bob, incoming, b"to bob" * 2000)
        net.run(lambda: False, 1.0)
    assert alice.core.path_to(bob.core.member_id) == bob.core.path_to(alice.core.member_id) == "relay"
    assert not [p for m in (alice, bob) for p in m.paths if p.after == PunchState.DIRECT]
    assert net.dropped > 0  # the challenges (and nothing else of the edge's) went there
    assert not alice.ended and not bob.ended

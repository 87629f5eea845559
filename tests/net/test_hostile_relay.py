"""A relay that alters what it forwards, between two real endpoints on real sockets.

The README promises a hostile rendezvous cannot alter a relayed edge. Each test runs a real
`RendezvousServer` whose core forwards relayed datagrams changed: bits flipped, the payload
forged behind an intact header, the authentication tag cut, bytes appended, datagrams
duplicated, swapped, replayed, or reflected back to their sender as if from the other member.
The endpoints must either deliver exactly the bytes sent, in order, or end the link with a clear
NetworkError — never hand up altered data.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from kafila.errors import NetworkError
from kafila.net import wire
from kafila.net.endpoint import PeerEndpoint
from rendezvous.core import Addr, Limits, Out, RendezvousCore
from tests.net.test_loopback import inprocess_rendezvous, other, two_members

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

Route = tuple[bytes, bytes, bytes]  # (payload, labelled as from member, delivered to member)
Tamper = Callable[[bytes, bytes, bytes], list[Route]]  # (sender, target, payload) -> what goes out instead


class TamperingCore(RendezvousCore):
    """The real rendezvous core, except that its relay forwards what `tamper` makes of each datagram."""

    def __init__(self, sockets: list[Addr], limits: Limits | None, tamper: Tamper) -> None:
        super().__init__(sockets, limits)
        self.tamper = tamper

    def _relay(self, frame: wire.Relay, src: Addr, now: float) -> list[Out]:
        honest = super()._relay(frame, src, now)  # the real checks: sender and target in one session
        if not honest:
            return honest
        sid, sender = self.by_addr[src]
        members = self.sessions[sid].members
        out: list[Out] = []
        for payload, label, to in self.tamper(sender, frame.peer, frame.payload):
            target = members[to]
            out.append((wire.encode_relay(wire.RELAYED, label, payload), target.local, target.addr))
        return out


@asynccontextmanager
async def tampering_relay(tamper: Tamper) -> AsyncIterator[Addr]:
    """A real rendezvous on loopback whose relay tampers."""
    async with inprocess_rendezvous(lambda socks, limits: TamperingCore(socks, limits, tamper)) as (rdv, _, _):
        yield rdv


def flip(rng: random.Random, p: bytes) -> bytes:
    """One bit flipped anywhere in the packet."""
    i = rng.randrange(len(p))
    return p[:i] + bytes([p[i] ^ (1 << rng.randrange(8))]) + p[i + 1:]


def forge(rng: random.Random, p: bytes) -> bytes:
    """Flags and connection id kept (so the packet reaches its connection), the rest random."""
    return p[:9] + rng.randbytes(len(p) - 9) if len(p) > 9 else p


def truncate(rng: random.Random, p: bytes) -> bytes:
    """Up to the whole 16-byte authentication tag cut off."""
    return p[: len(p) - rng.randrange(1, 17)]


def extend(rng: random.Random, p: bytes) -> bytes:
    """Random bytes appended (QUIC reads trailing bytes as a further coalesced packet)."""
    return p + rng.randbytes(rng.randrange(1, 64))


ALTERATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "flip": flip, "forge": forge, "truncate": truncate, "extend": extend,
}


class Altering:
    """Alters a share of the datagrams (both directions, handshake included); counts what it altered."""

    def __init__(self, alter: Callable[[random.Random, bytes], bytes], share: float, seed: int) -> None:
        self.alter, self.share = alter, share
        self.rng = random.Random(seed)
        self.altered = 0

    def __call__(self, sender: bytes, target: bytes, payload: bytes) -> list[Route]:
        if self.rng.random() < self.share:
            changed = self.alter(self.rng, payload)
            if changed != payload:
                self.altered += 1
                payload = changed
        return [(payload, sender, target)]


def messages(seed: int) -> list[bytes]:
    """Distinct messages of many sizes, one past a QUIC packet by far (it spans hundreds of packets)."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([1, 100, 1500, 4000, 20000])) for _ in range(30)] + [rng.randbytes(300_000)]


async def exchange(a: PeerEndpoint, b: PeerEndpoint, seed: int) -> tuple[int, int]:
    """Open a relayed link a -> b, send messages both ways; assert each arrives equal and in order."""
    link = await a.connect(other(a, b.member_id), timeout_s=60)
    incoming = await b.accept(60)
    assert link.path == "relay" and incoming.path == "relay"
    there, back = messages(seed), messages(seed + 1)
    for m in there:
        await link.send(m)
    for m in back:
        await incoming.send(m)
    got_there = [await incoming.recv(60) for _ in there]
    got_back = [await link.recv(60) for _ in back]
    # a final marker each way: a duplicated message would arrive before it
    await link.send(b"end")
    await incoming.send(b"end")
    assert await incoming.recv(60) == b"end" and await link.recv(60) == b"end"
    assert got_there == there, "altered or misordered data was delivered a -> b"
    assert got_back == back, "altered or misordered data was delivered b -> a"
    return len(there), len(back)


@pytest.mark.parametrize("how", sorted(ALTERATIONS))
async def test_altered_relayed_datagrams_are_dropped_and_the_data_arrives_intact(how: str) -> None:
    tamper = Altering(ALTERATIONS[how], share=0.2, seed=len(how))
    async with tampering_relay(tamper) as rdv, two_members(rdv, allow_direct=False) as (a, b):
        await exchange(a, b, seed=3)
    assert tamper.altered >= 20, f"the relay altered only {tamper.altered} datagrams: the test proved little"


class Shuffling:
    """Every datagram sent twice, each pair of datagrams per direction swapped, old ones replayed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.held: dict[tuple[bytes, bytes], bytes] = {}
        self.history: dict[tuple[bytes, bytes], deque[bytes]] = {}
        self.replayed = self.swapped = 0

    def __call__(self, sender: bytes, target: bytes, payload: bytes) -> list[Route]:
        key = (sender, target)
        past = self.history.setdefault(key, deque(maxlen=200))
        out = [payload, payload]
        if key in self.held:  # the one held back goes after this one
            out.append(self.held.pop(key))
            self.swapped += 1
        elif self.rng.random() < 0.3:
            self.held[key] = payload  # held until the next datagram this way (a retransmission if none)
            out = [payload]
        if past and self.rng.random() < 0.3:
            out.append(self.rng.choice(past))
            self.replayed += 1
        past.append(payload)
        return [(p, sender, target) for p in out]


async def test_duplicated_swapped_and_replayed_datagrams_deliver_each_message_once_in_order() -> None:
    tamper = Shuffling(seed=5)
    async with tampering_relay(tamper) as rdv, two_members(rdv, allow_direct=False) as (a, b):
        await exchange(a, b, seed=11)
    assert tamper.swapped >= 20 and tamper.replayed >= 20


class Switch:
    """Honest until switched on; then every datagram has one bit flipped."""

    def __init__(self) -> None:
        self.on = False
        self.rng = random.Random(9)
        self.altered = 0

    def __call__(self, sender: bytes, target: bytes, payload: bytes) -> list[Route]:
        if self.on:
            self.altered += 1
            payload = flip(self.rng, payload)
        return [(payload, sender, target)]


async def test_a_link_whose_every_datagram_is_altered_ends_with_an_error_and_delivers_nothing() -> None:
    tamper = Switch()
    async with tampering_relay(tamper) as rdv, \
            two_members(rdv, allow_direct=False, idle_timeout_s=1.5, keepalive_s=0.3) as (a, b):
        link = await a.connect(other(a, b.member_id), timeout_s=30)
        incoming = await b.accept(30)
        await link.send(b"before")
        assert await incoming.recv(30) == b"before"
        tamper.on = True
        await link.send(b"after: must never arrive")
        await incoming.send(b"after: must never arrive either")
        # QUIC drops every altered packet; with nothing authentic arriving, both ends time out
        with pytest.raises(NetworkError, match="closed"):
            await incoming.recv(60)
        with pytest.raises(NetworkError, match="closed"):
            await link.recv(60)
    assert tamper.altered > 0


async def test_a_link_that_cannot_get_one_authentic_datagram_through_fails_to_open() -> None:
    """Every datagram altered from the first: no handshake, a clear error, nothing accepted."""
    tamper = Switch()
    tamper.on = True
    async with tampering_relay(tamper) as rdv, two_members(rdv, allow_direct=False) as (a, b):
        with pytest.raises(NetworkError, match=r"cannot open a link to member .*handshake timed out"):
            await a.connect(other(a, b.member_id), timeout_s=3)
        assert b._accepted.empty()
    assert tamper.altered > 0


def reflect(sender: bytes, target: bytes, payload: bytes) -> list[Route]:
    """Every datagram goes back to its sender, labelled as coming from the member it was meant for."""
    return [(payload, target, sender)]


async def test_a_relay_reflecting_an_edge_onto_its_sender_is_refused_by_the_pin() -> None:
    """The host then handshakes with itself posing as the member; the certificate pin catches it."""
    async with tampering_relay(reflect) as rdv, two_members(rdv, allow_direct=False) as (a, b):
        with pytest.raises(NetworkError, match=r"cannot open a link to member .*someone is in the middle"):
            await a.connect(other(a, b.member_id), timeout_s=30)
        assert a._accepted.empty() and b._accepted.empty()
        # its server side of that handshake never turns ready either: it checks the pin too
        assert not [link for link in a._links.values() if link.ready.is_set()]

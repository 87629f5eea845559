"""A member forging punches between two others, over real sockets on loopback (issue #56 item 1).

Alice and bob are real endpoints on 127.0.0.1 with a real rendezvous in this process; mallory is a member too, on
127.0.0.66, and from eleven more sockets there she forges punch frames "from alice" to bob, with every key she holds,
before alice connects and all the while after: PUNCHes, and PUNCH_ACKs echoing every PUNCH bob sends her. Bob must
answer none of it, keep his path to alice on alice's own address and his candidate slots free of mallory's, and the
edge between alice and bob must carry every reply."""

from __future__ import annotations

import asyncio
import secrets
import socket

import pytest

from kafila.net import trust, wire
from kafila.net.endpoint import PeerEndpoint
from tests.net.test_loopback import inprocess_rendezvous

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]
Addr = tuple[str, int]
FORGER_IP = "127.0.0.66"


class Forger:
    """Mallory's raw sockets: one that talks to bob as 'alice', ten that only send him junk punches."""

    def __init__(self, keys: list[bytes], alice: bytes, bob: bytes, bob_addr: Addr) -> None:
        self.keys, self.alice, self.bob, self.bob_addr = keys, alice, bob, bob_addr
        self.socks = []
        for _ in range(11):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((FORGER_IP, 0))
            s.setblocking(False)
            self.socks.append(s)
        self.addrs = {s.getsockname() for s in self.socks}
        self.heard_from_bob = 0  # datagrams bob sent to any of mallory's addresses
        self.acks_forged = 0

    def frame(self, kind: int, key: bytes, nonce: bytes | None = None) -> bytes:
        stamp = int(asyncio.get_running_loop().time() * 1000) + secrets.randbelow(1000)  # fresh by any clock near
        n = nonce if nonce is not None else secrets.token_bytes(wire.NONCE_LEN)
        mac = trust.punch_mac(key, kind, self.alice, self.bob, stamp, n)
        return wire.encode_punch(wire.Punch(kind, self.alice, self.bob, stamp, n, mac))

    def round(self) -> None:
        """Forge a PUNCH from every socket with every key, and a PUNCH_ACK for every PUNCH bob sent here."""
        for s in self.socks:
            while True:
                try:
                    data, src = s.recvfrom(2048)
                except BlockingIOError:
                    break
                if src != self.bob_addr:
                    continue
                self.heard_from_bob += 1
                if data[:1] == bytes([wire.PUNCH]):
                    p = wire.decode(data)
                    assert isinstance(p, wire.Punch)
                    for key in self.keys:
                        s.sendto(self.frame(wire.PUNCH_ACK, key, nonce=p.nonce), self.bob_addr)
                        self.acks_forged += 1
            for key in self.keys:
                s.sendto(self.frame(wire.PUNCH, key), self.bob_addr)

    def close(self) -> None:
        for s in self.socks:
            s.close()


@pytest.mark.parametrize("alice_punches", [True, False], ids=["alice-punches", "alice-never-punches"])
async def test_a_member_cannot_steal_or_crowd_the_direct_path_between_two_others(alice_punches: bool) -> None:
    """With alice punching, she answers bob first on loopback; without (direct paths off on her side), only mallory
    would ever answer bob's punches: his edge to alice must stay on the relay rather than go to her."""
    async with inprocess_rendezvous() as (rdv, _, _):
        async with PeerEndpoint(bind=("127.0.0.1", 0), name="alice", allow_direct=alice_punches) as alice, \
                PeerEndpoint(bind=("127.0.0.1", 0), name="bob") as bob, \
                PeerEndpoint(bind=(FORGER_IP, 0), name="mallory") as mallory:
            everyone = (alice, bob, mallory)
            await asyncio.gather(*(m.probe_nat(rdv) for m in everyone))
            code = await alice.create_session(rdv)
            await asyncio.gather(bob.join_session(rdv, code), mallory.join_session(rdv, code))
            await asyncio.gather(*(m.announce() for m in everyone))
            await asyncio.gather(*(m.wait_for_members(3, 10) for m in everyone))
            keys = [code.punch_key]  # every key mallory holds toward bob: the session's, and her pair key with him
            pair = getattr(trust, "pair_punch_key", None)  # (before issue #56 the session's key was the only one)
            if pair is not None:
                keys.append(pair(code.punch_key, mallory.member_id, mallory.identity.punch_private, bob.member_id,
                                 bob.identity.punch_public))
            forger = Forger(keys, alice.member_id, bob.member_id, bob.local_addr)
            stop = asyncio.Event()

            async def forge() -> None:
                while not stop.is_set():
                    forger.round()
                    await asyncio.sleep(0.02)

            task = asyncio.create_task(forge())
            try:
                await asyncio.sleep(0.5)  # she starts first: bob would have punched her addresses before alice's
                link = await alice.connect(alice.peers[bob.member_id], timeout_s=5)
                incoming = await bob.accept(5)
                replies = 0
                for i in range(40):  # about 2 s of request and reply, the forging going on all along
                    await link.send(b"ping %d" % i)
                    assert await incoming.recv(2) == b"ping %d" % i
                    await incoming.send(b"pong %d" % i)
                    assert await link.recv(2) == b"pong %d" % i
                    replies += 1
                    await asyncio.sleep(0.05)
                path = await bob.settle_path(bob.peers[alice.member_id], 4)
                puncher = bob.core._punchers[alice.member_id]
            finally:
                stop.set()
                await task
                forger.close()
            assert replies == 40
            if alice_punches:
                assert path == "direct" and puncher.direct == alice.local_addr  # alice's own address, validated
            else:
                assert path == "relay" and puncher.direct is None
            assert not forger.addrs & set(puncher.candidates)  # not one slot is mallory's
            assert forger.heard_from_bob == 0  # bob answered none of it: no ACK, no punch, no QUIC

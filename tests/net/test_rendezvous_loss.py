"""The rendezvous lost mid-session, on the sans-I/O core and a fake clock with the real RendezvousCore in-process:
direct connections go on, relayed ones end with a reason naming the lost relay, re-joins go on, and the rendezvous
is seen coming back, having forgotten silent members (and an empty session) that then register again; then the
client's re-registration with a restarted rendezvous (a new, empty RendezvousCore), without sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kafila.errors import RendezvousError, WrongJoinCode
from kafila.net import events as ev
from kafila.net import wire
from kafila.net.core import CoreConfig
from kafila.net.rdvclient import RendezvousClient
from kafila.net.trust import JoinCode
from rendezvous.core import RendezvousCore
from tests.net.test_core import RELAY, Net, open_link, transfer

pytestmark = pytest.mark.fast

RELAY_NAME = f"{RELAY[0]}:{RELAY[1]}"


SESSION = CoreConfig(idle_timeout_s=5.0)  # a session's links: a silent peer is lost after 5 s


def three(net: Net) -> tuple[Any, Any, Any]:
    """alice and bob reach each other directly; cy only through the relay."""
    a = net.add("alice", ("10.0.0.1", 1000), SESSION)
    b = net.add("bob", ("10.0.0.2", 2000), SESSION)
    c = net.add("cy", ("10.0.0.3", 3000), SESSION)
    net.introduce()
    net.blocked = lambda src, dst: "10.0.0.3" in (src[0], dst[0])
    return a, b, c


def test_a_lost_rendezvous_ends_relayed_connections_with_its_name_and_direct_ones_serve_on() -> None:
    net = Net(seed=11)
    a, b, c = three(net)
    ab, ba = open_link(net, a, b)
    bc, cb = open_link(net, b, c)
    assert net.run(lambda: a.core.path_to(b.core.member_id) == "direct" and b.core.punch_outcome(c.core.member_id)[0],
                   5)
    assert b.core.path_to(c.core.member_id) == "relay"
    assert net.run(lambda: False, 20) is False  # 20 s alive: probes answered, nothing counts as lost
    assert all(not m.rendezvous for m in (a, b, c)) and a.rejoins >= 4
    net.relay_alive = False
    down_at = net.now
    lost = a.core.config.lost_after_s
    assert lost < a.core.config.idle_timeout_s
    assert net.run(lambda: bc in b.ended and cb in c.ended, lost + 1)
    for reason in (b.ended[bc], c.ended[cb]):
        assert f"its relay, the rendezvous at {RELAY_NAME}, is lost" in reason, reason
    # before QUIC's own idle timeout would have ended them without saying why
    assert net.now - down_at < a.core.config.idle_timeout_s
    for m, closed in ((a, 0), (b, 1), (c, 1)):
        (event,) = m.rendezvous
        assert isinstance(event, ev.RendezvousLost) and event.closed == closed and event.silent_s >= lost
        assert m.core.rendezvous_lost == event
    assert ab not in a.ended and ba not in b.ended
    transfer(net, a, ab, b, ba, b"still direct" * 1000)  # the direct edge serves on
    transfer(net, b, ba, a, ab, b"and back" * 1000)
    rejoins = a.rejoins
    keys = {m.name: m.reg_key for m in (a, b, c)}
    assert net.run(lambda: False, 30) is False
    assert a.rejoins >= rejoins + 5  # re-joins go on, so the member re-registers once it is back
    assert len(a.rendezvous) == 1  # lost once, not again and again
    net.relay_alive = True
    back_by = net.now + a.core.config.rejoin_s + 1
    assert net.run(lambda: all(len(m.rendezvous) == 2 for m in (a, b, c)), back_by - net.now)
    for m in (a, b, c):
        assert isinstance(m.rendezvous[1], ev.RendezvousBack) and m.rendezvous[1].silent_s > 30
        assert m.core.rendezvous_lost is None
    # silent past its 30 s, the members were forgotten by the rendezvous: they registered afresh (new keys)
    assert net.run(lambda: all(m.reg_key != keys[m.name] for m in (a, b, c)), a.core.config.rejoin_s + 1)
    assert registered(net) == {m.core.member_id for m in (a, b, c)}
    bc2 = b.core.connect(b.core.peers[c.core.member_id], net.now)  # the relay carries new links again
    assert net.run(lambda: bc2 in b.done, 10)


def test_a_rendezvous_silent_for_less_than_the_bound_is_not_lost() -> None:
    net = Net(seed=12)
    _a, b, c = three(net)
    bc, cb = open_link(net, b, c)
    net.relay_alive = False
    assert net.run(lambda: False, b.core.config.lost_after_s - 1) is False
    net.relay_alive = True
    assert net.run(lambda: False, 30) is False
    assert not b.rendezvous and bc not in b.ended and cb not in c.ended
    transfer(net, b, bc, c, cb, b"relayed" * 100)


def registered(net: Net) -> set[bytes]:
    """The member ids the net's rendezvous holds in the session it gave."""
    assert net.code is not None
    s = net.rendezvous.sessions.get(net.code.session_id)
    return set(s.members) if s is not None else set()


def test_a_rendezvous_out_of_reach_past_its_timeouts_gets_the_session_back_and_relays_again() -> None:
    """Out of reach longer than the rendezvous keeps a silent member (30 s) and a session nobody is in (60 s): it
    forgets both. When it answers again, the members' re-joins are refused as of an unknown session; they create
    it again under its id, join it afresh, and the relay carries a new link between two of them."""
    net = Net(seed=13)
    a, b, c = three(net)
    assert net.code is not None
    sid, ids = net.code.session_id, {m.core.member_id for m in (a, b, c)}
    assert registered(net) == ids
    keys, session = {m.name: m.reg_key for m in (a, b, c)}, net.rendezvous.sessions[sid]
    net.relay_alive = False
    assert net.run(lambda: False, 70) is False
    assert all(isinstance(m.rendezvous[-1], ev.RendezvousLost) for m in (a, b, c))
    net.relay_alive = True
    assert net.run(lambda: registered(net) == ids and all(m.reg_key != keys[m.name] for m in (a, b, c)),
                   a.core.config.rejoin_s + 1)
    assert list(net.rendezvous.sessions) == [sid] and net.rendezvous.sessions[sid] is not session  # made again
    assert all(isinstance(m.rendezvous[-1], ev.RendezvousBack) for m in (a, b, c))
    bc = b.core.connect(b.core.peers[c.core.member_id], net.now)
    assert net.run(lambda: bc in b.done and len(c.done) == 1, 10)
    (cb,) = c.done
    relayed = net.rendezvous.stats.relayed
    transfer(net, b, bc, c, cb, b"relayed again" * 100)
    assert b.core.path_to(c.core.member_id) == "relay" and net.rendezvous.stats.relayed > relayed


class Rendezvous:
    """A RendezvousCore behind an in-memory transport; `restart()` replaces it with a new, empty one."""

    ADDR = ("192.0.2.1", 3478)

    def __init__(self) -> None:
        self.core = RendezvousCore([self.ADDR])
        self.clients: dict[tuple[str, int], RendezvousClient] = {}
        self.now = 0.0

    def client(self, mid: bytes, addr: tuple[str, int]) -> RendezvousClient:
        def send(data: bytes, dst: tuple[str, int]) -> None:
            self.now += 0.01
            for out, _local, to in self.core.handle(data, addr, self.ADDR, self.now):
                frame = wire.decode(out)
                if isinstance(frame, wire.Control) and to in self.clients:
                    asyncio.get_running_loop().call_soon(self.clients[to].on_control, frame.request_id, frame.body)

        c = RendezvousClient(mid, send)
        self.clients[addr] = c
        return c

    def restart(self) -> None:
        self.core = RendezvousCore([self.ADDR])


def listed(rdv: Rendezvous, code: JoinCode) -> set[bytes]:
    s = rdv.core.sessions.get(code.session_id)
    return {mid for mid, m in s.members.items() if m.announcement} if s is not None else set()


def test_members_re_register_with_a_restarted_rendezvous() -> None:
    async def main() -> None:
        rdv = Rendezvous()
        host = rdv.client(b"h" * 8, ("10.0.0.1", 1000))
        member = rdv.client(b"m" * 8, ("10.0.0.2", 2000))
        code = await host.create(Rendezvous.ADDR)
        await member.join(Rendezvous.ADDR, str(code))
        for c in (host, member):
            await c.announce("QQ==" * 8)
        assert listed(rdv, code) == {b"h" * 8, b"m" * 8}
        await member.rejoin()  # an ordinary re-join changes nothing
        rdv.restart()
        assert listed(rdv, code) == set()
        await member.rejoin()  # the session is created again under its id, joined and announced again
        assert listed(rdv, code) == {b"m" * 8}
        await host.rejoin()  # a second member finds it created: it joins it
        assert listed(rdv, code) == {b"h" * 8, b"m" * 8}
        await host.rejoin()  # and the new registration keys prove themselves on the next re-join
        await member.rejoin()
        assert listed(rdv, code) == {b"h" * 8, b"m" * 8}
        # whoever knows only the session id cannot create it again under another code while it lives
        stranger = rdv.client(b"x" * 8, ("10.0.0.9", 9000))
        stranger.rendezvous = Rendezvous.ADDR
        wrong = JoinCode(code.session_id, JoinCode.new_secret())
        with pytest.raises(WrongJoinCode):
            await stranger.request({"op": "create", "join_pub": wrong.join_public.hex(), "session": code.session_id})
        with pytest.raises(RendezvousError, match="session id"):
            await stranger.request({"op": "create", "join_pub": wrong.join_public.hex(), "session": "I/O"})

    asyncio.run(main())

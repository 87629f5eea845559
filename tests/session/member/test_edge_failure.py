"""A member whose ring edge cannot open reports it to its coordinator and stays for its word.

A real member (MemberRuntime, its own PeerEndpoint) in a session on an in-process rendezvous, the test as its
coordinator over a real QUIC control link (tests/session/scripted.py), and bo, a member of the session whose
endpoint is there but never opens its ring edges. ada's ring is (ada, bo): told to connect, ada links to bo,
but bo, its predecessor too, never links to ada. ada's edge from bo cannot open: ada reports bo lost in its
epoch, sends no `ready`, and goes on following its coordinator (it does not leave the session over it).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from kafila.session.protocol import messages
from kafila.session.protocol.manifest import StageManifest
from tests.session.scripted import SETTINGS, member

pytestmark = pytest.mark.fast

EDGE_TIMEOUT_S = 2.0  # how long ada waits for its predecessor's link (15 s in a session): the clock under test


async def test_an_edge_that_cannot_open_is_reported_lost_and_the_member_stays(tmp_path: Path) -> None:
    async with member(tmp_path, "ada", others=["bo"]) as m:
        ep = m.runtime.ep
        ep.open_ring = functools.partial(ep.open_ring, timeout_s=EDGE_TIMEOUT_S)  # type: ignore[method-assign]
        bo = m.others["bo"].me
        assert bo is not None
        # what the coordinator assigned in epoch 4 (its stage is not this test's: the edges are)
        fps = {"ada": ep.identity.fingerprint.hex(), "bo": m.others["bo"].identity.fingerprint.hex()}
        m.runtime.follower.assignment = messages.Assign(
            epoch=4, order=("ada", "bo"), head="ada", ranges={"ada": (0, 2), "bo": (2, 4)}, settings=SETTINGS, plan={},
            model="m", stage=StageManifest("0" * 64, 1, 1 << 20, ("0" * 64,)), fingerprints=fps)
        m.runtime.state.set_phase("delivering")  # as after that assignment (the phase table: connecting comes next)
        await m.host.send(messages.Connect(4))
        lost = await m.first(messages.Lost)
        why = f"predecessor bo ({bo.short_id}) did not connect within {EDGE_TIMEOUT_S:.0f} s"
        assert lost == messages.Lost("bo", f"its ring edge could not open: {why}", 4)
        assert not m.host.inbox.of(messages.Ready)  # the ring is not ready
        assert m.host.inbox.of(messages.Working) and all(  # it said what it was doing meanwhile, in its epoch
            w == messages.Working(4, "opening its ring edges") for w in m.host.inbox.of(messages.Working))
        assert m.runtime.ring.edges is None
        assert not m.run.done()  # still in the session, waiting for the coordinator
        assert f"ring edge to bo failed: {why}; waiting for the host" in [t for _, t in m.runtime.state.events]
        # the coordinator's word: bo is lost (the member stops), then the session ends
        await m.host.send(messages.Lost("bo", lost.reason, 4))
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0

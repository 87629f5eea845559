"""Which proposed direct path carries a peer's packets (kafila.net.directpath), with a real Puncher as the proposer."""

from __future__ import annotations

import itertools

import pytest

from kafila.net.directpath import DirectPaths
from kafila.net.punch import Puncher, PunchState

pytestmark = pytest.mark.fast

A_ID, B_ID = b"A" * 8, b"B" * 8
THERE = ("100.64.0.12", 2000)


def proposing(addr: tuple[str, int] | None) -> Puncher:
    """A puncher whose punch proved `addr` both ways (None: it fell back to the relay)."""
    p = Puncher(A_ID, B_ID, b"k" * 32, [THERE])
    p.state, p.direct = (PunchState.DIRECT, addr) if addr is not None else (PunchState.RELAY, None)
    return p


def test_a_proposed_address_carries_nothing_until_a_challenge_there_is_answered() -> None:
    paths, p = DirectPaths(), proposing(THERE)
    assert paths.route(p) is None and paths.pending(p)
    change = paths.change(p)
    assert change is not None and change.after == PunchState.PUNCHING and change.direct is None  # not DIRECT yet
    assert not paths.confirm(p, [("10.6.6.6", 1)], 1.0)  # an answer for another address validates nothing
    assert paths.outcome(p) == (False, None)
    assert paths.confirm(p, [THERE], 1.5) and paths.route(p) == THERE and not paths.pending(p)
    change = paths.change(p)
    assert change is not None and change.after == PunchState.DIRECT and change.direct == THERE
    assert paths.outcome(p) == (True, 1.5)
    fallen = proposing(None)  # the punch fell back: what was proven is forgotten, a new proposal starts over
    assert paths.due(fallen, 2.0) is None and paths.route(fallen) is None
    assert paths.route(proposing(THERE)) is None


def test_challenges_back_off_and_wait_for_a_connection_to_send_them() -> None:
    paths, p = DirectPaths(retry_s=0.2, max_retry_s=1.0), proposing(THERE)
    assert paths.due(p, 0.0, ready=False) is None and paths.next_wakeup(p) is None  # no connection yet: no try spent
    assert paths.due(p, 0.0) == THERE
    sent = [0.0]
    while len(sent) < 7:  # unanswered: each next challenge later, up to max_retry_s apart
        t = paths.next_wakeup(p)
        assert t is not None and paths.due(p, t - 0.01) is None and paths.due(p, t) == THERE
        sent.append(t)
    assert [round(b - a, 6) for a, b in itertools.pairwise(sent)] == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    paths.confirm(p, [THERE], 10.0)
    assert paths.due(p, 20.0) is None and paths.next_wakeup(p) is None

"""rendezvous.evict's order against a scan of the table by its rule: of the networks holding a session not in use,
one holding the most live sessions gives one up, its idlest one no second address joined first."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import RendezvousBusy
from rendezvous.limits import Limits
from rendezvous.state import Member
from rendezvous.table import SessionTable

pytestmark = pytest.mark.fast

LIMITS = Limits(max_sessions=8, max_sessions_per_net=5)
NETS = ["10.0.1.1", "10.0.2.1", "10.0.3.1"]  # three creators' networks
JOINERS = [("10.0.1.7", 1), ("10.0.1.8", 2), ("192.0.2.1", 3), ("198.51.100.1", 4)]  # two ports of one site, two others
LOCAL = ("100.64.0.2", 3478)

# (what happens, which network, session or joiner, and the time it takes)
ops = st.lists(st.tuples(st.sampled_from(["add", "join", "touch", "drop"]), st.integers(0, 7)), max_size=60)


@settings(max_examples=1000, deadline=None)
@given(ops)
def test_the_first_to_drop_is_what_a_scan_of_the_table_picks(steps: list[tuple[str, int]]) -> None:
    table, n = SessionTable(LIMITS), 0
    touched: dict[str, int] = {}  # when each session last had something happen, as the table was told
    for clock, (op, k) in enumerate(steps):
        sessions = list(table.sessions.values())
        s = sessions[k % len(sessions)] if sessions else None
        if op == "add":
            try:
                touched[table.add(b"", NETS[k % len(NETS)], float(clock)).session_id] = clock
            except RendezvousBusy:  # the network's share, or full of sessions in use
                pass
        elif op == "join" and s is not None:
            n += 1
            src = JOINERS[k % len(JOINERS)]
            table.joined(s, Member(n.to_bytes(8, "big"), src, LOCAL, float(clock)), src, LOCAL, float(clock))
            touched[s.session_id] = clock
        elif op == "touch" and s is not None:
            table.touch(s, float(clock))
            touched[s.session_id] = clock
        elif op == "drop" and s is not None:
            table.drop(s.session_id)
        live = Counter(s.owner for s in table.sessions.values())
        droppable = [s for s in table.sessions.values() if len(s.join_sites) < 2]
        evictable = table._evictable
        assert evictable.live == live
        assert sorted(evictable.candidates()) == sorted(s.session_id for s in droppable)
        if droppable:
            first = table.sessions[next(evictable.candidates())]
            assert live[first.owner] == max(live[s.owner] for s in droppable)
            own = [s for s in droppable if s.owner == first.owner]
            unjoined = [s for s in own if len(s.join_addrs) < 2]
            assert first in (unjoined or own)
            assert touched[first.session_id] == min(touched[s.session_id] for s in (unjoined or own))

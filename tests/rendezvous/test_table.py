"""SessionTable's expiry (a heap of what is due) against a full scan of the table by the same rules."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rendezvous.limits import Limits
from rendezvous.state import Member, Session
from rendezvous.table import SessionTable

pytestmark = pytest.mark.fast

LIMITS = Limits(max_sessions=6, max_sessions_per_net=4, member_timeout_s=3.0, empty_session_ttl_s=5.0,
                unjoined_session_ttl_s=8.0, session_max_age_s=20.0)
ADDRS = [(f"10.0.{i}.1", 1000 + i) for i in range(4)]
LOCAL = ("100.64.0.2", 3478)


def scanned(table: SessionTable, now: float) -> dict[str, set[bytes]]:
    """Which sessions and members a full scan keeps at `now`: members silent member_timeout_s go, then
    sessions too old, never joined from a second address, or empty and idle."""
    lim = table.limits
    kept = {}
    for sid, s in table.sessions.items():
        members = {mid for mid, m in s.members.items() if m.last_seen + lim.member_timeout_s > now}
        gone = (s.created + lim.session_max_age_s <= now
                or (len(s.join_addrs) < 2 and s.created + lim.unjoined_session_ttl_s <= now)
                or (not members and s.last_active + lim.empty_session_ttl_s <= now))
        if not gone:
            kept[sid] = members
    return kept


def state(table: SessionTable) -> dict[str, set[bytes]]:
    return {sid: set(s.members) for sid, s in table.sessions.items()}


# (what happens, which session and member it concerns, how long until the next step)
ops = st.lists(st.tuples(st.sampled_from(["add", "join", "seen", "leave"]), st.integers(0, 3),
                         st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 0.1 + 0.2]) | st.floats(0.0, 9.0)), max_size=60)


@settings(max_examples=2000, deadline=None)
@given(ops)
# a member seen again after its first deadline was checked: its entry is checked again later
@example([("add", 0, 0.0), ("join", 0, 2.0), ("seen", 0, 1.0), ("add", 0, 3.0)])
# a session whose deadline moved (it was touched): its entry is checked again later
@example([("add", 0, 3.0), ("join", 0, 0.5), ("add", 0, 2.0), ("join", 0, 0.5), ("add", 0, 2.0)])
def test_expiry_keeps_what_a_full_scan_keeps(steps: list[tuple[str, int, float]]) -> None:
    table = SessionTable(LIMITS)
    now, n = 0.0, 0
    for op, k, dt in steps:
        sessions = list(table.sessions.values())
        s: Session | None = sessions[k % len(sessions)] if sessions else None
        m: Member | None = None
        if s is not None and s.members:
            m = list(s.members.values())[k % len(s.members)]
        if op == "add":
            try:
                table.add(b"", f"net{k % 2}", now)
            except Exception:  # the network's share, or full of sessions in use: as a real create would be
                pass
        elif op == "join" and s is not None:
            n += 1
            member = Member(n.to_bytes(8, "big"), ADDRS[k % 4], LOCAL, now)
            table.joined(s, member, ADDRS[k % 4], LOCAL, now)
        elif op == "seen" and s is not None and m is not None:  # a ping or an announce, as the core records it
            m.last_seen = now
            table.touch(s, now)
        elif op == "leave" and s is not None and m is not None:
            table.remove(s.session_id, m.member_id)
        now += dt  # 0.1 + 0.2 is not 0.3: sums that round land exactly on, or a hair off, a deadline
        expected = scanned(table, now)
        table.expire(now)
        assert state(table) == expected, now


def test_a_deadline_reached_exactly_ends_the_scan() -> None:
    """A member due exactly now, or a hair later by rounding, is removed or checked again later, never
    pushed again for now (which would loop for ever)."""
    table = SessionTable(LIMITS)
    s = table.add(b"", "net", 0.1)
    table.joined(s, Member(b"m" * 8, ADDRS[0], LOCAL, 0.1), ADDRS[0], LOCAL, 0.1)
    table.expire(0.1 + LIMITS.member_timeout_s)
    assert not s.members
    assert all(due > 0.1 + LIMITS.member_timeout_s for due, *_ in table._due)

"""A real `kafila rendezvous` whose table a flood pins (issue 56 finding 4): 32 addresses of one network, 4 ports
each, for 30 s; each session joined from other ports of the address that made it, which once counted as a
session in use, never dropped for room. The table holds as many sessions as that network may make (64), so
the flood fills it; from 20 s on, a new host at another address opens a session and a member at another
site joins it a second later. Before the fix the flood's sessions all counted as in use and the host was refused
("full"); with "in use" counted by sites alone, the host's session was the first dropped when the flood made its next
one (rendezvous/evict.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from rendezvous.limits import Limits
from tests.net.conftest import running_rendezvous
from tests.net.flooding import Flood, end_flood, new_host_and_member, start_flood

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
# as fast as the rendezvous answers: a flood that outran it would lose the host's requests in its socket's buffer,
# timing retries (0.5 s each) rather than the table (on this 2-core machine beside other work, a quarter of all)
FLOOD = Flood(sources=[f"127.0.1.{i}" for i in range(1, 33)], ports=4, own_ports=True, seconds=30.0, window=8)
TABLE = Limits().max_sessions_per_net  # one network's share: what the flood may fill
HOST_AT_S = 20.0  # the table as full as the flood makes it: in a second, with a burst of creates and joins
WITHIN_S = 2.0  # the acceptance line's bound, for each of the host's session and the member's join
# the member joins this long after the host has its session, as a member given the code would (later, in life):
# meanwhile the flood makes sessions again, and before, the host's session was the first it dropped
MEMBER_AFTER_S = 1.0


async def test_sessions_pinned_from_ports_of_one_address_leave_room_for_a_new_host(
        capsys: pytest.CaptureFixture[str]) -> None:
    with running_rendezvous("--max-sessions", str(TABLE)) as (rdv, _):
        flooder, figures = start_flood(FLOOD, rdv)
        t0 = time.monotonic()
        try:
            await asyncio.sleep(HOST_AT_S)
            created, joined = await new_host_and_member(rdv, "127.0.0.1", "127.0.2.1", MEMBER_AFTER_S)  # 2 sites
            at = time.monotonic() - t0
        finally:
            flood = end_flood(flooder, figures, FLOOD)
    with capsys.disabled():
        print(f"\nflood {json.dumps(flood)}; {HOST_AT_S:g} s into it the host's session took {created:.3f} s, and the"
              f" member's join {MEMBER_AFTER_S:g} s later {joined:.3f} s (all done {at:.1f} s in)")
    assert flood["sessions"] >= TABLE and flood["joins"] >= 2 * TABLE  # the flood did fill and pin the table
    assert created <= WITHIN_S and joined <= WITHIN_S

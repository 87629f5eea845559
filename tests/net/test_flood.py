"""A real `kafila rendezvous` under a flood from 32 addresses of one network (issue 34 item 1): the flood
reads its replies (it echoes cookies, as an attacker with real addresses can), creates sessions, joins
them from a second address of its own, and pings, as fast as one process can; meanwhile a new host opens a
session and a member joins it. Before the fix the flood's 32 addresses x 64 sessions filled the
1,000-session table and the host was refused ("full")."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.net.flooding import Flood, end_flood, new_host_and_member, start_flood

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
FLOOD = Flood(sources=[f"127.0.1.{i}" for i in range(1, 33)], seconds=20.0)
Addr = tuple[str, int]


async def test_a_flood_from_one_network_leaves_room_for_a_new_host(rendezvous_proc: tuple[Addr, subprocess.Popen[str]],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rdv, _ = rendezvous_proc
    flooder, figures = start_flood(FLOOD, rdv)
    try:
        time.sleep(FLOOD.seconds / 2)  # the flood has had its way for a while
        created, joined = await new_host_and_member(rdv, "127.0.0.1", "127.0.0.1")
    finally:
        flood = end_flood(flooder, figures, FLOOD)
    with capsys.disabled():
        print(f"\nflood {json.dumps(flood)}; host's session {created:.2f} s, member joined {joined:.2f} s")
    assert flood["sessions"] >= 32  # the flood did take sessions: its quota's worth, not the table
    assert joined < 10.0  # a bound on a hang only: the time is reported above, and in docs/benchmarks.md

"""A group's first session: members connect before they measure their machines, and the host waits for them.

`--wait` bounds the wait for members to arrive; a member that arrived is waited for while it measures, up to
`--measure-wait`. Real processes on loopback; a member's measurement is slowed or stalled by `kafila join`
with the probe patched (the session's cache holds a real probe, so an unpatched member measures at once).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.session.cluster import Cluster

pytestmark = pytest.mark.slow

WAIT_S = 20  # for members to arrive: a member starts, probes its NAT and connects well within it
SLOW_S = WAIT_S + 2  # the slowed member's measurement outlasts the whole --wait by itself
MEASURE_WAIT_S = 10

# the probe reports two decode timing attempts (as a busy machine's does) and answers only after SLOW_S
SLOW = f"""
import sys
import kafila.session.member.join as join
real = join.cached_probe
def slow(*args, on_wait=None, stop=None, **kwargs):
    on_step = args[2]
    for i in range({SLOW_S}):
        on_step(f"timing decode calls (attempt {{1 + 2 * i // {SLOW_S}}} of 3)", i, {SLOW_S})
        if stop.wait(1):
            raise SystemExit("stopped")
    return real(*args, on_wait=on_wait, stop=stop, **kwargs)
join.cached_probe = slow
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""

# the probe never ends (until the member's session does)
STALLED = """
import sys
import kafila.session.member.join as join
from kafila.errors import EngineError
def stalled(*args, on_wait=None, stop=None, **kwargs):
    args[2]("timing decode calls (attempt 1 of 3)", 0, 22)
    stop.wait()
    raise EngineError("the probe was stopped")
join.cached_probe = stalled
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_member_measuring_past_the_wait_is_planned_in(tmp_path: Path) -> None:
    with Cluster(tmp_path, [("ada", [])], scripts={"ada": SLOW},
                 host_args=["--members", "1", "--wait", str(WAIT_S), "--measure-wait", "120"]) as cluster:
        # the dashboard shows it measuring, live: its step and time so far
        cluster.wait_state(cluster.url, lambda s: (s["members"].get("ada", {}).get("status") == "measuring"
                                                   and "timing decode calls" in s["members"]["ada"]["note"]
                                                   and "s so far" in s["members"]["ada"]["note"]), WAIT_S)
        state = cluster.wait_phase({"admitted", "rejected"}, SLOW_S + 240)
        out = cluster.host.output
        assert state["phase"] == "admitted", out
        assert state["plan"]["order"] == ["ada"], out
        assert "ada arrived (1/1); it is measuring its machine" in out, out
        assert "ada is measuring: timing decode calls (attempt 2 of 3)" in out, out
        took = re.search(r"ada measured its machine in (\d+) s", out)
        assert took and int(took.group(1)) >= WAIT_S, out  # measured after the whole --wait had passed
        assert out.index("ada arrived") < out.index("ada measured") < out.index("ada joined (1/1)"), out
        assert "no member joined" not in out, out


def test_a_member_that_never_finishes_measuring_is_left_out(tmp_path: Path) -> None:
    with Cluster(tmp_path, [("ada", []), ("bo", [])], scripts={"bo": STALLED},
                 host_args=["--wait", "60", "--measure-wait", str(MEASURE_WAIT_S)]) as cluster:
        started = time.monotonic()
        state = cluster.wait_phase({"admitted", "rejected"}, 240)
        out = cluster.host.output
        assert state["phase"] == "admitted", out
        assert state["plan"]["order"] == ["ada"], out
        assert time.monotonic() - started >= MEASURE_WAIT_S, out
        assert (f"bo left out: still measuring its machine after {MEASURE_WAIT_S} s (--measure-wait; "
                "timing decode calls (attempt 1 of 3))") in out, out
        assert "bo joined" not in out, out
        members = cluster.state()["members"]
        assert members["bo"]["status"] == "measuring" and members["ada"]["status"] != "measuring", members
        assert cluster.members["bo"].popen.poll() is None  # still measuring: planned in later if it finishes


def test_no_member_measured_ends_the_session_and_the_member_hears_why(tmp_path: Path) -> None:
    with Cluster(tmp_path, [("bo", [])], scripts={"bo": STALLED},
                 host_args=["--wait", "60", "--measure-wait", str(MEASURE_WAIT_S)]) as cluster:
        assert cluster.host.popen.wait(120) == 1
        cluster.host.reader.join(5)
        why = f"no member finished measuring its machine within {MEASURE_WAIT_S} s (--measure-wait): bo"
        assert f"kafila: error: {why}" in cluster.host.output, cluster.host.output
        bo = cluster.members["bo"]
        assert bo.popen.wait(30) == 1, bo.output
        bo.reader.join(5)
        assert f"the session's host has gone: the host ended the session: {why}" in bo.output, bo.output
        assert "Traceback" not in cluster.host.output + bo.output

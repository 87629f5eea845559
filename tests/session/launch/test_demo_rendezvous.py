"""The demo's rendezvous start: ready when its log says it listens, a clear error when it stops first;
either way the process is in the list the demo stops, and no pipe is left to it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from kafila.errors import SessionError
from kafila.session.launch.demo import RENDEZVOUS_READY, _start_rendezvous, _stop

pytestmark = pytest.mark.fast


async def test_ready_once_the_log_says_so_and_only_this_runs_lines_count(tmp_path: Path) -> None:
    log = tmp_path / "rendezvous.log"
    log.write_bytes(RENDEZVOUS_READY + b" 127.0.0.1:1 (an earlier run)\n")
    script = (f"import sys, time; time.sleep(0.5); sys.stderr.write({RENDEZVOUS_READY.decode()!r} + ' x\\n'); "
              "time.sleep(60)")
    procs: list[asyncio.subprocess.Process] = []
    try:
        started = asyncio.get_running_loop().time()
        await _start_rendezvous([sys.executable, "-c", script], log, {}, procs)
        assert asyncio.get_running_loop().time() - started >= 0.5  # not the earlier run's line
        assert len(procs) == 1 and procs[0].returncode is None
        assert procs[0].stderr is None and procs[0].stdout is None  # straight to the log, no pipe
    finally:
        await _stop(procs)
    assert procs[0].returncode is not None


async def test_a_rendezvous_that_stops_before_listening_is_a_clear_error(tmp_path: Path) -> None:
    log = tmp_path / "rendezvous.log"
    procs: list[asyncio.subprocess.Process] = []
    with pytest.raises(SessionError, match="stopped before it listened"):
        await _start_rendezvous([sys.executable, "-c", "import sys; sys.exit('no port')"], log, {}, procs)
    assert len(procs) == 1 and procs[0].returncode == 1
    assert "no port" in log.read_text()

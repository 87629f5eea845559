"""A host told to stop (SIGTERM) while it cuts a stage stops at once, cleanly, and leaves no half-written file.

The cut runs on a worker thread. Before, asyncio.run's exit waited for that thread, so a SIGTERM
mid-cut waited for the whole cut (with a big model, past the CLI's 15 s deadline: "stopping took
over", status 1). The test makes the moment certain without timing it: it stops the host process
(SIGSTOP, every thread standing) once the stage's temporary file exists and most of the stage is
still to write, sends SIGTERM, and lets it go on (SIGCONT). A host that finished the cut before
stopping leaves the stage file behind.

The SIGTERM arrives while the process stands, so the kernel hands it to whichever thread runs first
after SIGCONT, often the cutting one. Python runs the handler only in the main thread, which slept in
the event loop's poll until its next timer: in one of six traced runs, half a second in which the cut
wrote 180 MB, enough to finish a cut stopped late (kafila.stopping now wakes the poll at once, and the
cut reads the stop itself every 8 MiB).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.session.cluster import STOPPED_STATUSES, Cluster, Proc
from tests.synthetic import write_synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
FILLER_MB = 100  # per block: a 400 MB model, a stage of hundreds of MB to cut


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("big") / "big.gguf", "llama", n_blocks=4, filler_mb=FILLER_MB)


def wait_for_cut(stages: Path, host: Proc, timeout: float) -> Path:
    """The stage's temporary file, once the host has begun writing it (the host then stands: SIGSTOP)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tmp = next(stages.rglob(".*.tmp"), None) if stages.exists() else None
        if tmp is not None:
            host.stop_now()
            return tmp
        time.sleep(0.005)
    raise AssertionError(f"the host never began cutting a stage under {stages}")


def test_sigterm_while_cutting_a_stage_stops_the_host_cleanly(tmp_path: Path, big_model: Path) -> None:
    with Cluster(tmp_path, [("ada", [])], host_args=["--members", "1", str(big_model)]) as cluster:
        host = cluster.host.popen
        stages = tmp_path / "cache" / "stages"
        try:
            tmp = wait_for_cut(stages, cluster.host, 300)
            finished = [p for p in tmp.parent.glob("*.gguf") if not p.name.startswith(".")]  # the big model's
            assert tmp.exists() and not finished, "the cut ended before the host was stopped: the test proved nothing"
            written = tmp.stat().st_size  # most of the stage still to write: dozens of pieces a stop must reach
            assert written < big_model.stat().st_size // 2, f"the host was stopped late ({written} bytes written)"
            host.send_signal(signal.SIGTERM)
        finally:
            os.kill(host.pid, signal.SIGCONT)
        status = host.wait(120)  # a bound on a hang only: the CLI itself gives up after 15 s
        cluster.host.reader.join(5)
        assert status in STOPPED_STATUSES and "stopping took over" not in cluster.host.output, cluster.host.output
        assert "Traceback" not in cluster.host.output, cluster.host.output
        left = sorted(p.name for p in tmp.parent.iterdir())
        assert left == [], f"the stopped cut left {left} (it ran on after SIGTERM, or did not clean up)"

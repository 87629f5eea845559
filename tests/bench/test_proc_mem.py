"""The benchmark's RSS sampler on a real child process: it samples inside its window and reads nothing
while inactive (a /proc scan every 50 ms slowed the ring it was measuring)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from kafila.bench.proc_mem import RssSampler, children

pytestmark = pytest.mark.fast


def test_sampler_reads_proc_only_while_active() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    active = threading.Event()
    scanned = threading.Event()

    def in_window(label: str) -> bool:
        scanned.set()  # asked only after a scan of /proc found children
        return True

    sampler = RssSampler(in_window=in_window, active=active.is_set, period_s=0.01)
    try:
        assert child.pid in children()
        sampler.start()
        assert not scanned.wait(0.3)  # 30 periods, none of them read /proc
        assert sampler.labels == {} and sampler.first_kb == {}
        active.set()
        assert scanned.wait(10)
        sampler.stop()
        label = sampler.labels[child.pid]
        assert sampler.first_kb[label] > 0 and sampler.window_peak_kb[label] >= sampler.first_kb[label]
    finally:
        sampler.stop()
        child.kill()
        child.wait()

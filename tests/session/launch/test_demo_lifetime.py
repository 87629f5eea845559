"""A demo killed outright (SIGKILL: no clean-up runs) still leaves no rendezvous or member running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafila.session.launch.demo import DemoOptions
from tests.conftest import processes_marked
from tests.shared_probe import shared_probe

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def test_killed_demo_takes_its_members_with_it(tmp_path: Path) -> None:
    marker = str(tmp_path / "cache")  # every process of this demo has it in its environment
    shared_probe(tmp_path / "cache", DemoOptions().member_threads())  # the members start at once, not after a probe
    demo = subprocess.Popen([sys.executable, str(REPO / "kafila.py"), "demo", "--prompt", "Tell me a long story.",
                             "--max-tokens", "400", "--api-port", "0"],  # 0: no fixed port to collide on
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "KAFILA_CACHE_DIR": marker})
    try:
        deadline = time.monotonic() + 240
        while len(processes_marked(marker)) < 5:  # the demo, the rendezvous and three members
            assert demo.poll() is None and time.monotonic() < deadline, "the demo's members did not start"
            time.sleep(0.5)
    finally:
        demo.send_signal(signal.SIGKILL)
        demo.wait(10)
    # a bound on a hang only: each process gets SIGTERM at once (its parent died) and the CLI's own
    # deadline ends a stuck stop after 15 s, so 15 s here raced that deadline on a loaded machine
    deadline = time.monotonic() + 60
    while (left := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.3)
    for pid in left:  # leave nothing behind, whatever the verdict
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the killed demo: {left}"

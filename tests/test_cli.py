"""The command-line boundary's stop: SIGTERM unwinds like Ctrl-C, and a stuck unwind is cut short."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a command whose clean-up hangs: it catches the KeyboardInterrupt that SIGTERM raises, then sleeps
STUCK = """
import signal, sys, time
import kafila.cli as cli
cli.STOP_DEADLINE_S = 1.0
signal.signal(signal.SIGTERM, cli._terminate)
print("ready", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    time.sleep(60)  # stuck on the way out
"""


def test_a_stop_that_hangs_is_cut_short_with_a_trace() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUCK], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and time.monotonic() - t0 < 10
    assert "stopping took over 1 s; where it was:" in err
    assert 'File "<string>", line 10' in err  # the main thread's stack: the line it was stuck on

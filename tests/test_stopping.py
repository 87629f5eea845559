"""A SIGTERM to a session flow cancels it from its own await, never in the middle of a callback; a stuck
unwind is cut short showing the await every task was stuck in.

No test here times the unwind: an unwind that completes is given a stop deadline far beyond any unwind
(HANG_S), so a slow machine cannot cut it short and turn its status 130 into 1; the stuck unwind, which
never completes, is cut by a short deadline (STUCK_DEADLINE_S) whatever the machine's speed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
HANG_S = 60  # a bound on a hang only: the deadline a completing unwind never meets, and the wait for the process
STUCK_DEADLINE_S = 2.0  # the deadline that cuts the stuck unwind short (its length is not what is tested)

# `kafila.cli.main` running one extra command whose flow, like a session's, runs under run_printing.
# Its event loop is kept busy with callbacks that each take 20 ms, as a burst of datagrams does.
FLOW = """
import asyncio, sys, time, types
import kafila.cli as cli, kafila.stopping as stopping
from kafila.session.terminal.printer import run_printing
stopping.STOP_DEADLINE_S = DEADLINE_S
inside = []

def busy():
    inside.append(1)
    time.sleep(0.02)  # a protocol callback at work: a signal must not unwind out of it
    inside.pop()
    asyncio.get_running_loop().call_soon(busy)

async def flow(state):
    asyncio.get_running_loop().call_soon(busy)
    print("ready", flush=True)
    try:
        await asyncio.sleep(60)
    finally:
        print(f"unwound from its await; callbacks cut short: {len(inside)}", flush=True)
        if STUCK:
            await asyncio.Event().wait()  # a clean-up that never ends

def run(args):
    return run_printing(flow)
sys.modules["kafila.commands.flow"] = types.SimpleNamespace(HELP="a flow", configure=lambda p: None, run=run)
cli.COMMANDS["flow"] = "flow"
sys.exit(cli.main(["flow"]))
"""


def stopped(stuck: bool) -> subprocess.CompletedProcess[str]:
    """Run the flow, SIGTERM it once it is ready, and return how it ended."""
    deadline = STUCK_DEADLINE_S if stuck else HANG_S
    proc = subprocess.Popen([sys.executable, "-c", f"STUCK, DEADLINE_S = {stuck}, {deadline}\n" + FLOW], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=deadline + HANG_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_sigterm_cancels_the_flow_at_its_await_and_no_callback_is_cut_short() -> None:
    for _ in range(5):  # the loop is inside a callback most of the time: a raised interrupt would land there
        out = stopped(stuck=False)
        assert out.returncode == 130, out
        assert out.stdout.splitlines() == ["unwound from its await; callbacks cut short: 0"], out


def test_a_stuck_unwind_is_cut_short_naming_the_await_it_hangs_in() -> None:
    out = stopped(stuck=True)
    assert out.returncode == 1, out
    assert f"stopping took over {STUCK_DEADLINE_S:.0f} s; where it was:" in out.stderr
    stuck_line = FLOW.splitlines().index("            await asyncio.Event().wait()  # a clean-up that never ends") + 2
    assert f"<string>:{stuck_line} in flow" in out.stderr, out.stderr  # the task's own chain of awaits
    assert "locks.py" in out.stderr.split(f"<string>:{stuck_line} in flow")[1]  # ...down into Event.wait

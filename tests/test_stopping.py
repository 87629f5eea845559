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


# Work on a worker thread that takes the SIGTERM itself, as the kernel may choose (after a SIGCONT, the
# thread that runs first takes a signal that arrived while the process was stopped), once the main thread
# sleeps in the event loop's poll. Nothing else is on the loop: no timer wakes the poll, only the signal can.
SIGTERM_IN_A_WORKER = """
import asyncio, signal, sys, threading, time
from pathlib import Path
from kafila.errors import WorkStopped
from kafila.session.stoppable import run_stoppable
from kafila.stopping import cancelled_by_sigterm

def main_thread_sleeps():
    stat = Path(f"/proc/self/task/{threading.main_thread().native_id}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "S"

def work(progress):
    asleep = 0
    while asleep < 5:  # seen asleep five times in a row, 20 ms apart, while this thread lets it have the GIL
        time.sleep(0.02)
        asleep = asleep + 1 if main_thread_sleeps() else 0
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    pieces = 0
    try:
        while True:  # a cut that would run far longer than the test waits
            progress(pieces, 0)
            pieces += 1
            time.sleep(0.01)
    except WorkStopped:
        print("the work stopped", flush=True)
        raise

try:
    asyncio.run(cancelled_by_sigterm(run_stoppable(work)))
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_a_sigterm_taken_by_a_worker_thread_stops_its_work_and_the_flow() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_IN_A_WORKER], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=HANG_S)  # before, the loop slept on: a hang until this bound
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "the work stopped\n", "")

"""The command-line boundary: SIGTERM unwinds like Ctrl-C, a stuck unwind is cut short, and the join code
is read and checked before anything slow starts."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]

# Runs kafila.cli.main with one extra command, `stuck`, whose clean-up hangs. It says "ready" from
# inside its try: a SIGTERM that follows the word always lands where the command handles it.
STUCK = """
import sys, time, types
import kafila.cli as cli, kafila.stopping as stopping
stopping.STOP_DEADLINE_S = 1.0
def run(args):
    try:
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        time.sleep(60)  # stuck on the way out
sys.modules["kafila.commands.stuck"] = types.SimpleNamespace(HELP="hangs", configure=lambda p: None, run=run)
cli.COMMANDS["stuck"] = "stuck"
sys.exit(cli.main(["stuck"]))
"""
STUCK_LINE = STUCK.splitlines().index("        time.sleep(60)  # stuck on the way out") + 1

# A SIGTERM that is already pending when main() installs its handler (a demo stopping a member the
# moment it started, a parent already gone): it is delivered as follow_parent() runs, and must be an
# interrupt, not a traceback.
EARLY = """
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # first: any thread started later inherits the mask
os.kill(os.getpid(), signal.SIGTERM)
import kafila.cli as cli
cli.follow_parent = lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
sys.exit(cli.main(["inspect"]))
"""

# A SIGTERM that lands while the process is already exiting by itself (a test stopping a cluster whose
# member just finished): Python restores SIGTERM's default action before it clears modules, so the
# object's __del__ below sends the signal at the moment that would make a clean exit a death by signal.
EXITING = """
import os, signal
import kafila.cli as cli
class StopWhileExiting:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
keep = StopWhileExiting()
cli.main = lambda: 0
cli.run_process()
"""


def test_a_stop_that_hangs_is_cut_short_with_a_trace() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUCK], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    # the deadline's own message shows it cut the stop short (no wall-clock bound here)
    assert proc.returncode == 1, err
    assert "stopping took over 1 s; where it was:" in err
    assert f'File "<string>", line {STUCK_LINE}' in err  # the main thread's stack: the line it was stuck on


def test_a_sigterm_as_soon_as_the_handler_is_installed_is_an_interrupt() -> None:
    out = subprocess.run([sys.executable, "-c", EARLY], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (130, "kafila: interrupted\n")


def test_a_sigterm_while_exiting_keeps_the_exit_status() -> None:
    out = subprocess.run([sys.executable, "-c", EXITING], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (0, "")


def fresh_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with an empty cache (a probe, had one started, would leave its result there)."""
    env = {k: v for k, v in os.environ.items() if k != "KAFILA_JOIN_CODE"}
    return {**env, "KAFILA_CACHE_DIR": str(tmp_path / "cache"), "KAFILA_DATA_DIR": str(tmp_path / "data"), **extra}


def kafila(*args: str, tmp_path: Path, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `python kafila.py ARGS` as a user would (stdin: this text, else nothing)."""
    return subprocess.run([sys.executable, "kafila.py", *args], cwd=REPO, input=stdin if stdin is not None else "",
                          capture_output=True, text=True, timeout=120, env=fresh_env(tmp_path, **env))


MALFORMED = "expected 24 letters/digits like k7q2m9xd-4f8t-zr2w-9mhc-qp3a"


@pytest.mark.parametrize("how", ["argument", "stdin", "environment"])
def test_a_malformed_join_code_fails_at_once_in_one_line(tmp_path: Path, how: str) -> None:
    code = "k7q2m9xd-4f8t-zr2w"  # a code cut short when pasted
    args, stdin, env = {"argument": ([code], None, {}), "stdin": (["-"], code + "\n", {}),
                        "environment": ([], None, {"KAFILA_JOIN_CODE": code})}[how]
    t0 = time.monotonic()
    out = kafila("join", *args, "--rendezvous", "127.0.0.1:9", "--api-port", "-1", tmp_path=tmp_path, stdin=stdin,
                 **env)
    elapsed = time.monotonic() - t0
    assert out.returncode == 1, out
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("kafila: error: join code") and MALFORMED in out.stderr
    assert not (tmp_path / "cache").exists()  # nothing was measured: the machine's probe caches its result
    print(f"malformed code ({how}) refused in {elapsed:.2f} s, interpreter start included")


def test_the_dashboard_checks_the_join_code_before_its_screen_opens(tmp_path: Path) -> None:
    out = kafila("tui", "--join", tmp_path=tmp_path, KAFILA_JOIN_CODE="k7q2m9xd-4f8t")
    assert out.returncode == 1, out
    assert out.stderr.startswith("kafila: error: join code") and MALFORMED in out.stderr and "\x1b" not in out.stdout


def test_no_join_code_and_no_terminal_to_ask_on(tmp_path: Path) -> None:
    out = kafila("join", "--api-port", "-1", tmp_path=tmp_path)
    assert out.returncode == 1
    assert out.stderr == ("kafila: error: no join code: give it as an argument, '-' to read it from standard input, "
                          "or in KAFILA_JOIN_CODE\n")


def test_the_prompt_reads_the_code_from_the_terminal(tmp_path: Path) -> None:
    """On a terminal, `kafila join` with no code asks for it (so it is never in argv, nor in ps)."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "kafila.py", "join", "--api-port", "-1"], cwd=REPO,
                            env=fresh_env(tmp_path), stdin=child, stdout=subprocess.PIPE, stderr=child, text=True)
    os.close(child)
    try:
        seen = b""
        while b"join code: " not in seen:
            assert select.select([main], [], [], 60)[0], f"no prompt within 60 s; saw {seen!r}"
            seen += os.read(main, 1024)
        os.write(main, b"not-a-code\n")
        assert proc.wait(timeout=60) == 1
        rest = b""
        try:
            while chunk := os.read(main, 1024):
                rest += chunk
        except OSError:  # the child closed its end: everything it wrote has been read
            pass
        assert b"kafila: error: join code 'not-a-code' is malformed" in rest, rest
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
            proc.wait()

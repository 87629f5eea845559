"""The parent watch where /proc or prctl is missing (macOS, Windows), simulated with real processes here."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kafila import process

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent


def test_alive_without_proc_asks_the_os(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process.alive(child.pid, tmp_path / "no-proc")
    finally:
        child.kill()
        child.wait()
    assert not process.alive(child.pid, tmp_path / "no-proc")  # reaped: the pid is free


def test_with_proc_an_unreaped_child_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process.alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not process.alive(child.pid)  # a zombie until wait() below
    child.wait()


def test_no_prctl_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert process.request_parent_death_signal() is False


def test_no_prctl_in_this_libc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: SimpleNamespace())  # a libc without prctl
    assert process.request_parent_death_signal() is False


# A "one-file binary" child on a system with neither prctl nor /proc: it must watch its bootloader
# (its parent) and end when that is SIGKILLed.
CHILD = """
import sys, time
from pathlib import Path
import kafila.process as p
sys._MEIPASS = "/nowhere/_MEIabc123"
sys.platform = "darwin"
p.PROC = Path("/nowhere/proc")
p.WATCH_EVERY_S = 0.05
p.follow_parent()
print("watching", flush=True)
time.sleep(60)
"""
BOOTLOADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_without_prctl_or_proc_the_binary_ends_with_its_bootloader() -> None:
    boot = subprocess.Popen([sys.executable, "-c", BOOTLOADER, CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert boot.stdout is not None
        pid = int(boot.stdout.readline())
        assert boot.stdout.readline().strip() == "watching"
        assert process.alive(pid)
        boot.kill()
        boot.wait()
        deadline = time.monotonic() + 20
        while process.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not process.alive(pid), "the child outlived its killed bootloader"
    finally:
        if boot.poll() is None:
            boot.kill()
            boot.wait()

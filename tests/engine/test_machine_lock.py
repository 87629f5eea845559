"""Probes on one machine take turns (issue 59): a probe waits for another Kafila process's probe, says so once,
and a stop ends its wait. The lock is the kernel's (flock) on a per-user file in the temporary directory."""

from __future__ import annotations

import fcntl
import tempfile
import threading
from pathlib import Path

import pytest

from kafila.engine import probe_cache
from kafila.errors import EngineError

pytestmark = pytest.mark.fast


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # not the machine's real lock: tests run beside probes
    return tmp_path


def test_the_lock_is_per_user_in_the_temporary_directory(lock_dir: Path) -> None:
    assert probe_cache.machine_lock_path().parent == lock_dir
    assert probe_cache.machine_lock_path().name.startswith("kafila-probe-")


def test_a_probe_waits_for_another_process_and_says_so_once(lock_dir: Path) -> None:
    waits: list[str] = []
    got = threading.Event()

    def second() -> None:
        with probe_cache.machine_lock(lambda: waits.append("waiting")):
            got.set()

    with probe_cache.machine_lock_path().open("a") as other:  # another process's probe (an open file of its own)
        fcntl.flock(other, fcntl.LOCK_EX)
        t = threading.Thread(target=second)
        t.start()
        assert not got.wait(3 * probe_cache.POLL_S)
        fcntl.flock(other, fcntl.LOCK_UN)
    t.join(10)
    assert got.is_set() and waits == ["waiting"]


def test_a_stop_ends_the_wait(lock_dir: Path) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with probe_cache.machine_lock(stop=stop):
                pass
        except EngineError as exc:
            errors.append(exc)

    with probe_cache.machine_lock_path().open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        t = threading.Thread(target=second)
        t.start()
        stop.set()
        t.join(10)
    assert not t.is_alive() and [str(e) for e in errors] == ["the probe was stopped"]

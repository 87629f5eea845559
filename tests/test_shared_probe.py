"""The probe shared by concurrent test runs (tests/shared_probe.py): one run probes, the others wait for it and
read its result; none measures beside another or reads half a file."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import tests.shared_probe as shared_probe_module
from kafila.engine.probe import ProbeResult
from tests.shared_probe import LOCK_NAME, sample_probe, shared_probe

pytestmark = pytest.mark.fast

RESULT = sample_probe()
HANG_S = 120  # a bound on a hang only: every wait below ends on an event


def waiting_on_lock(lock: Path) -> bool:
    """Whether some process or thread is blocked taking the flock on `lock` (Linux: /proc/locks marks it `->`)."""
    try:
        inode = lock.stat().st_ino
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    return any("->" in line and "FLOCK" in line and f":{inode} " in line for line in table.splitlines())


def test_concurrent_runs_probe_once_and_all_read_that_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run A is inside the (faked) probe, run B starts meanwhile: B must wait on the shared lock, not probe beside A.

    The fake probe holds A inside until B is seen either blocked on the lock (the event a correct run
    reaches) or inside the probe too (a second, concurrent probe: the failure). No clock decides it.
    """
    if not Path("/proc/locks").exists():
        pytest.skip("needs /proc/locks to see a run waiting on the lock")
    import kafila.engine.probe_cache as measure

    shared = tmp_path / "shared"
    monkeypatch.setattr(shared_probe_module, "_shared_dir", lambda: shared)
    probed: list[str] = []
    inside = threading.Event()
    second = threading.Event()

    def fake_probe(*_args: Any, **_kwargs: Any) -> ProbeResult:
        probed.append(threading.current_thread().name)
        if len(probed) > 1:
            second.set()
            return RESULT
        inside.set()
        for _ in range(HANG_S * 50):  # until B is blocked on the lock, or probing too
            if second.wait(0.02) or waiting_on_lock(shared / LOCK_NAME):
                break
        return RESULT

    monkeypatch.setattr(measure, "probe_isolated", fake_probe)
    errors: list[BaseException] = []

    def run(cache: Path) -> None:
        try:
            shared_probe(cache)
        except BaseException as exc:  # reported by the test's own thread
            errors.append(exc)

    a = threading.Thread(target=run, args=(tmp_path / "a",), name="run-a")
    b = threading.Thread(target=run, args=(tmp_path / "b",), name="run-b")
    a.start()
    assert inside.wait(HANG_S), errors
    b.start()
    a.join(HANG_S)
    b.join(HANG_S)
    assert not a.is_alive() and not b.is_alive() and not errors, errors
    assert probed == ["run-a"]  # B read A's probe instead of measuring beside it
    files = {run: sorted((tmp_path / run).glob("probe-*.json")) for run in ("a", "b")}
    assert len(files["a"]) == 1 and [f.name for f in files["a"]] == [f.name for f in files["b"]], files
    for run in ("a", "b"):  # every run's cache holds the one probe, whole
        saved = json.loads(files[run][0].read_text())
        assert ProbeResult.from_dict(saved["result"]) == RESULT

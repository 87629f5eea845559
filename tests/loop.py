"""Run the same tests N times, one run after another, and count passes and failures per test.

    .venv/bin/python -m tests.loop -n 20 tests/net/test_hostile_relay.py
    .venv/bin/python -m tests.loop -n 20 tests/session/test_ring_e2e.py::test_killed_member -- -x

Everything after the test ids (or after `--`) goes to pytest. Each run is a fresh pytest process
(as `make test` runs it), its results read from pytest's own JUnit XML. The output of every failed
run is kept under --keep (a temporary directory by default) and named in the summary. The exit
status is 0 only when every run passed and no test was skipped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    """Outcomes per test id, and per run."""

    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    runs_failed: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, test: str, outcome: str) -> None:
        self.outcomes.setdefault(test, Counter())[outcome] += 1


def outcomes(junit: Path) -> list[tuple[str, str]]:
    """(test id, passed/failed/error/skipped) for every test case in a JUnit XML report."""
    found: list[tuple[str, str]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        found.append((test, {"failure": "failed"}.get(outcome, outcome)))
    return found


def run_once(i: int, pytest_args: list[str], keep: Path, tally: Tally, keep_all: bool = False) -> bool:
    junit = keep / f"run-{i:03d}.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *pytest_args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    tally.seconds.append(time.monotonic() - t0)
    if junit.exists():
        for test, outcome in outcomes(junit):
            tally.add(test, outcome)
    ok = proc.returncode == 0
    if ok:
        junit.unlink(missing_ok=True)
    else:
        tally.runs_failed.append(i)
    if not ok or keep_all:
        (keep / f"run-{i:03d}.log").write_text(proc.stdout + proc.stderr)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--times", type=int, default=20, help="how many runs (default 20)")
    ap.add_argument("--keep", type=Path, help="where failed runs' output goes (default: a new temporary directory)")
    ap.add_argument("--keep-all", action="store_true", help="keep every run's output there, passed runs' too")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="test ids and pytest options")
    args = ap.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"]
    if args.times < 1 or not pytest_args:
        ap.error("give -n >= 1 and at least one test id")
    keep = args.keep or Path(tempfile.mkdtemp(prefix="kafila-loop-"))
    keep.mkdir(parents=True, exist_ok=True)
    tally = Tally()
    for i in range(1, args.times + 1):
        ok = run_once(i, pytest_args, keep, tally, args.keep_all)
        print(f"run {i}/{args.times}: {'pass' if ok else 'FAIL'} ({tally.seconds[-1]:.1f} s)", flush=True)
    print(f"\n{args.times - len(tally.runs_failed)}/{args.times} runs passed; "
          f"{sum(tally.seconds):.0f} s in all, slowest run {max(tally.seconds):.1f} s")
    for test, counts in sorted(tally.outcomes.items()):
        print(f"  {test}: " + ", ".join(f"{k} {counts[k]}" for k in ("passed", "failed", "error", "skipped")
                                        if counts[k]))
    if tally.runs_failed:
        print(f"failed runs' output: {keep}/run-NNN.log for runs {tally.runs_failed}")
    skipped = any(c["skipped"] for c in tally.outcomes.values())
    return 0 if not tally.runs_failed and not skipped else 1


if __name__ == "__main__":
    raise SystemExit(main())

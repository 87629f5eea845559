"""The one-file binary alone does what the Python checkout does (issue 7).

Builds `kafila` with build.spec once per session (see conftest.py; KAFILA_SKIP_BINARY=1 skips),
then runs it with a clean environment from a folder outside the repository. The Python run of
the same command is the ground truth.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time

import pytest

from tests.conftest import run_kafila
from tests.packaging.conftest import BUILD_TIMEOUT_S, REPO, REPORT, Binary

# The build happens in the first test's setup: allow for it on a busy two-core machine.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 600)

STARTUP_RUNS = 5
STARTUP_BOUND_S = 15.0  # the target is under 5 s; a test only catches gross regressions


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The run's stdout, after checking it exited 0 (its output is in the message if not)."""
    assert proc.returncode == 0, (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")
    return proc.stdout


def test_version_matches_python_and_starts_fast(kafila_binary: Binary) -> None:
    timings = []
    for _ in range(STARTUP_RUNS):
        start = time.perf_counter()
        out = _ok(kafila_binary.run("--version"))
        timings.append(time.perf_counter() - start)
    median = statistics.median(timings)
    REPORT["--version start-up"] = (f"{median:.2f} s median of {STARTUP_RUNS} "
                                    f"(min {min(timings):.2f} s, max {max(timings):.2f} s)")
    # The llama.cpp build identity must be the one the Python install reports: members compare it,
    # and a binary that failed to find llama_cpp/lib would hash nothing.
    assert out == _ok(run_kafila("--version"))
    assert "llama.cpp libs" in out
    assert median < STARTUP_BOUND_S, REPORT["--version start-up"]
    # Each start unpacks the bundle (about 250 MB) into $TMPDIR; a clean exit must remove it.
    assert not list((kafila_binary.root / "tmp").glob("_MEI*"))


def test_every_command_is_inside(kafila_binary: Binary) -> None:
    # kafila.cli imports command modules by name and leaves out any it cannot find, so a module
    # missing from the bundle would silently drop a command: the help must list the same ones.
    frozen = _ok(kafila_binary.run("--help"))
    assert frozen == _ok(run_kafila("--help", env={"COLUMNS": "80"}))


def test_plan_on_a_fleet_file(kafila_binary: Binary) -> None:
    for name in ("fleet-lan.json", "qwen3-8b-q4_k_m.json"):
        shutil.copy(REPO / "bench" / name, kafila_binary.root / name)
    out = _ok(kafila_binary.run("plan", "--fleet", "fleet-lan.json", "--model", "qwen3-8b-q4_k_m.json", "--json"))
    plan = json.loads(out)
    assert plan["feasible"] is True, plan


def test_inspect_embedded_model(kafila_binary: Binary) -> None:
    out = _ok(kafila_binary.run("inspect", "--json"))
    assert json.loads(out) == json.loads(_ok(run_kafila("inspect", "--json")))


def test_generate_matches_python(kafila_binary: Binary) -> None:
    args = ("generate", "--split", "10,20", "--max-tokens", "24", "--temperature", "0", "The capital of France is")
    frozen = _ok(kafila_binary.run(*args))
    python = _ok(run_kafila(*args))
    REPORT["generate vs Python"] = "identical" if frozen == python else "DIFFERENT"
    assert frozen == python
    assert frozen.strip()

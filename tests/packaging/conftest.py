"""The one-file `kafila` binary, built once per test session from this checkout (build.spec).

Set KAFILA_SKIP_BINARY=1 to skip every test here (the build takes a minute or more).
Everything the binary is run with comes from `clean_env`: no PYTHONPATH, no virtualenv,
a fresh HOME, a working directory outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[2]
SKIP = os.environ.get("KAFILA_SKIP_BINARY", "") not in ("", "0")
BUILD_TIMEOUT_S = 1500

# Figures shown in the terminal summary (size, build time, start-up), filled in by the tests.
REPORT: dict[str, str] = {}


@dataclass
class Binary:
    path: Path
    build_seconds: float
    root: Path  # a scratch folder outside the repository: cwd and HOME for the runs
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run the binary as a user would on a machine without Python or the checkout."""
        return subprocess.run([str(self.path), *args], capture_output=True, text=True, encoding="utf-8",
                              timeout=timeout, cwd=self.root, env=self.env)


def clean_env(home: Path, tmp: Path) -> dict[str, str]:
    """A minimal environment: PATH, HOME and TMPDIR only.

    The one-file binary unpacks itself into $TMPDIR/_MEIxxxxxx on every start and removes that on
    exit; a TMPDIR inside the test's folder (itself under the system's temporary folder, so as
    executable as the default) keeps anything a killed run leaves behind out of /tmp.
    """
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp)}


@pytest.fixture(scope="session")
def kafila_binary(tmp_path_factory: pytest.TempPathFactory) -> Binary:
    """Build dist/kafila into a temporary folder (never the checkout's build/ or dist/)."""
    if SKIP:
        if in_ci():
            pytest.fail("KAFILA_SKIP_BINARY is set in CI, where the binary must be built and tested")
        pytest.skip("KAFILA_SKIP_BINARY is set")
    out = tmp_path_factory.mktemp("binary")
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
           "--distpath", str(out / "dist"), "--workpath", str(out / "build"), str(REPO / "build.spec")]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out, timeout=BUILD_TIMEOUT_S)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        pytest.fail(f"PyInstaller failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    path = out / "dist" / "kafila"
    assert path.is_file(), f"build.spec made no {path}"
    shutil.rmtree(out / "build")  # PyInstaller's work folder: as large as the binary, not needed now
    root = out / "run"
    for sub in ("home", "tmp"):
        (root / sub).mkdir(parents=True)
    REPORT["binary size"] = f"{path.stat().st_size / 1e6:.1f} MB"
    REPORT["build time"] = f"{seconds:.0f} s"
    return Binary(path, seconds, root, clean_env(root / "home", root / "tmp"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.write_sep("-", "kafila binary")
        for key, value in REPORT.items():
            terminalreporter.write_line(f"{key}: {value}")

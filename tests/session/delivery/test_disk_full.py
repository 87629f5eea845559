"""A member without disk space for its stage says so, with the numbers, and the host plans again without it.

The small disk is a real tmpfs of 64 KiB, mounted over the member's delivery folder in a mount namespace
of its own (`unshare -rm`), so nothing else on the machine sees it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing_tool
from tests.session.cluster import REPO, Cluster

pytestmark = pytest.mark.slow

NO_SPACE = re.compile(r"no space left on (\S+): need ([\d.]+) MB, have ([\d.]+) MB")


def small_disk(folder: Path, size: str = "64k") -> list[str]:
    """A command prefix that runs a command with a small tmpfs (64 KiB) mounted over `folder`."""
    return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"', str(folder)]


@pytest.fixture
def can_mount(tmp_path: Path) -> None:
    try:
        ok = subprocess.run([*small_disk(tmp_path), "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        missing_tool("this machine does not let a test mount a tmpfs in a namespace of its own (unshare -rm)")


def test_a_member_whose_disk_is_too_small_says_so_and_the_host_replans(tmp_path: Path, can_mount: None) -> None:
    delivered = tmp_path / "cache" / "delivered"
    delivered.mkdir(parents=True)
    with Cluster(tmp_path, [("ada", []), ("bo", [])], member_prefix={"bo": small_disk(delivered)}) as ring:
        bo = ring.members["bo"]
        bo.popen.wait(240)
        bo.reader.join(5)
        state = ring.wait_phase({"admitted"})
        host_log = ring.host.output
    assert bo.popen.returncode not in (0, None)
    m = NO_SPACE.search(bo.output)
    assert m is not None, bo.output
    assert m.group(1) == str(delivered) and float(m.group(2)) > float(m.group(3))  # need more than it has
    assert NO_SPACE.search(host_log) and "planning again over the remaining members" in host_log
    assert state["plan"]["order"] == ["ada"]


WRITE_UNTIL_FULL = """
import sys
from pathlib import Path
from kafila.errors import DiskFullError
from kafila.session.delivery.stage_files import StageReceiver, manifest_for, read_chunk
src, folder = Path(sys.argv[1]), Path(sys.argv[2])
m = manifest_for(src)
rx = StageReceiver(folder, m)
rx.missing()
rx.check_space()  # it fits now ...
(folder / "filler").write_bytes(b"x" * (200 * 1024))  # ... until something else takes the space
try:
    rx.accept(0, read_chunk(src, m, 0))
except DiskFullError as exc:
    print(exc)
"""


def test_running_out_of_space_while_writing_is_said_with_the_numbers(tmp_path: Path, can_mount: None) -> None:
    src = tmp_path / "stage.gguf"
    src.write_bytes(bytes(range(256)) * 400)  # 100 KiB: fits in 256 KiB, not beside the filler
    folder = tmp_path / "small"
    folder.mkdir()
    out = subprocess.run([*small_disk(folder, "256k"), sys.executable, "-c", WRITE_UNTIL_FULL, str(src), str(folder)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    m = NO_SPACE.search(out.stdout)
    assert m is not None, out.stdout + out.stderr
    assert m.group(1) == str(folder) and float(m.group(2)) == pytest.approx(0.1, abs=0.01)

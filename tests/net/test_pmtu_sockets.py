"""Path MTU search over real sockets: loopback carries the maximum; a loopback with a 1,308-byte MTU (a network
namespace of the test's own, `unshare -rn`) carries 1,280-byte datagrams and nothing bigger."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kafila.net import wire
from kafila.net.pmtu import MAXIMUM, PmtuConfig
from tests.conftest import missing_tool
from tests.net.pmtu_link import measure
from tests.session.cluster import REPO

pytestmark = pytest.mark.timeout(180)
LO_MTU = 1308  # IPv4 (20) and UDP (8) headers leave 1,280 bytes of datagram


async def test_loopback_carries_the_largest_size() -> None:
    found = await measure(2 << 20)
    assert found == {"host": MAXIMUM, "member": MAXIMUM, "path": "direct", "intact": True}


async def test_a_relayed_edge_carries_the_largest_size_in_the_relays_envelope() -> None:
    """A relayed datagram is the QUIC one plus a 9-byte envelope: 1,461 bytes still fit the relay's frame limit."""
    found = await measure(1 << 20, allow_direct=False)
    assert found == {"host": MAXIMUM, "member": MAXIMUM, "path": "relay", "intact": True}
    assert MAXIMUM + 1 + wire.ID_LEN <= wire.MAX_DATAGRAM


def small_loopback() -> list[str]:
    """A command prefix that runs a command in a network namespace whose loopback's MTU is LO_MTU."""
    return ["unshare", "-rn", "sh", "-c", f'ip link set lo mtu {LO_MTU} up && exec "$@"', "sh"]


def test_a_smaller_path_is_found_and_never_exceeded() -> None:
    try:
        ok = subprocess.run([*small_loopback(), "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        missing_tool("this machine does not let a test make a network namespace of its own (unshare -rn, ip)")
    run = subprocess.run([*small_loopback(), sys.executable, "-m", "tests.net.pmtu_link", str(2 << 20)],
                         capture_output=True, text=True, timeout=150, cwd=REPO)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    carries = LO_MTU - 28
    step = PmtuConfig().step
    assert found["intact"] and found["path"] == "direct"
    for side in ("host", "member"):
        assert carries - step < found[side] <= carries, found

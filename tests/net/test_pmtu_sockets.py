"""Path MTU search over real sockets: loopback carries its route's size (up to aioquic's limit); a
loopback with a 1,308-byte MTU (a network namespace of the test's own, `unshare -rn`) carries 1,280-byte
datagrams and nothing bigger."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kafila.net import wire
from kafila.net.pmtu import DEFAULT_CEILING, LIMIT, PmtuConfig
from kafila.net.udp import route_payload_limit
from tests.conftest import missing_tool
from tests.net.pmtu_link import measure
from tests.session.cluster import REPO

pytestmark = [pytest.mark.fast, pytest.mark.timeout(180)]
LO_MTU = 1308  # IPv4 (20) and UDP (8) headers leave 1,280 bytes of datagram


def test_the_route_size_is_the_interfaces_mtu_less_the_headers() -> None:
    with open("/sys/class/net/lo/mtu") as f:  # an IPv4 packet is at most 65,535 bytes, whatever the MTU
        assert route_payload_limit(("127.0.0.1", 9)) == min(int(f.read()), 65535) - 28


async def test_loopback_carries_its_routes_size() -> None:
    """Loopback's MTU (65,536 here) is past what aioquic can frame: the search stops at LIMIT, not Ethernet's."""
    route = route_payload_limit(("127.0.0.1", 9))
    assert route is not None and route > DEFAULT_CEILING
    top = min(route, LIMIT)
    found = await measure(2 << 20)
    assert found == {"host": top, "member": top, "path": "direct", "intact": True}


async def test_a_relayed_edge_carries_the_largest_size_in_the_relays_envelope() -> None:
    """A relayed datagram is the QUIC one plus a 9-byte envelope: 1,461 bytes still fit the relay's frame limit."""
    found = await measure(1 << 20, allow_direct=False)
    assert found == {"host": DEFAULT_CEILING, "member": DEFAULT_CEILING, "path": "relay", "intact": True}
    assert DEFAULT_CEILING + 1 + wire.ID_LEN <= wire.MAX_DATAGRAM


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

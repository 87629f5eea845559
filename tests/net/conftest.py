"""Fixtures for network tests: free UDP port pairs and a real `kafila rendezvous` subprocess on loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafila.net.ports import free_udp_pair

REPO = Path(__file__).resolve().parents[2]


def free_port_pair(ip: str = "127.0.0.1", alt_ip: str | None = "127.0.0.2") -> int:
    """A port P such that P and P+1 are free for UDP on ip (and alt_ip)."""
    return free_udp_pair(ip, alt_ip)


@pytest.fixture
def rendezvous_proc() -> Iterator[tuple[tuple[str, int], subprocess.Popen[str]]]:
    """`python kafila.py rendezvous` on 127.0.0.1:P (and 127.0.0.2 as its second address)."""
    port = free_port_pair()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "kafila.py"), "rendezvous", "--host", "127.0.0.1", "--port", str(port),
         "--alt-ip", "127.0.0.2", "--stats-every", "1"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError("the rendezvous exited at start")
            if "listening" in line:
                break
        else:
            raise TimeoutError("the rendezvous did not start")
        yield ("127.0.0.1", port), proc
    finally:
        proc.kill()  # by its own pid; it is ours
        proc.wait(timeout=10)

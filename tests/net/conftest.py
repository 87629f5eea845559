"""Fixtures for network tests: free UDP port pairs and a real `kafila rendezvous` subprocess on loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

from kafila.net.ports import free_udp_pair
from tests.session.cluster import LISTENING_RE, PORT_TRIES, Proc


def free_port_pair(ip: str = "127.0.0.1", alt_ip: str | None = "127.0.0.2") -> int:
    """A port P such that P and P+1 are free for UDP on ip (and alt_ip) now; bind it with retries (it can be taken)."""
    return free_udp_pair(ip, alt_ip)


@pytest.fixture
def rendezvous_proc() -> Iterator[tuple[tuple[str, int], subprocess.Popen[str]]]:
    """`python kafila.py rendezvous` on 127.0.0.1:P (and 127.0.0.2 as its second address): running_rendezvous."""
    with running_rendezvous() as started:
        yield started


@contextlib.contextmanager
def running_rendezvous(*args: str) -> Iterator[tuple[tuple[str, int], subprocess.Popen[str]]]:
    """`python kafila.py rendezvous ARGS` on 127.0.0.1:P (and 127.0.0.2 as its second address), killed at the end.

    Its output is read by a thread (Proc), so the wait for 'listening' has a deadline a blocking
    readline could not keep, and its stats lines never fill the pipe. A port taken between being
    picked and bound means another try on a new one.
    """
    for _ in range(PORT_TRIES):
        port = free_port_pair()
        proc = Proc("rendezvous", ["rendezvous", "--host", "127.0.0.1", "--port", str(port), "--alt-ip", "127.0.0.2",
                                   "--stats-every", "1", *args], dict(os.environ))
        if proc.wait_for_either(LISTENING_RE, 60):
            break
        if proc.popen.poll() is None:
            proc.popen.kill()  # by its own pid; it is ours
        proc.popen.wait()
    else:
        raise AssertionError(f"the rendezvous never listened:\n{proc.output}")
    try:
        yield ("127.0.0.1", port), proc.popen
    finally:
        proc.popen.kill()
        proc.popen.wait(timeout=10)
        print("rendezvous output (its stats each second):", *proc.lines[-40:], sep="\n")  # shown when a test fails

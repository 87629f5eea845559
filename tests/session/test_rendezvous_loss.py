"""The rendezvous killed mid-session (kill -9), with real processes on loopback where every edge is direct:
serving goes on, every process says the rendezvous is unreachable, nobody exits; when a rendezvous comes
back on the same address, every process registers the session with it again.

The address must still be free when the rendezvous comes back, a minute or more later: any process on the
machine may bind a free port meanwhile (another test run's picks among them). So the test binds both of
the rendezvous' ports the moment the killed one has exited, holds them while the session goes on without
it, and the rendezvous comes back on those very sockets: the real RendezvousServer, in this process (its
bind is handed the held socket for each address; everything after the bind is the server's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.cluster import Cluster

PROMPT = "What is the capital of France?"
MAX_TOKENS = 8
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a whole session of processes on a loaded machine
MEMBERS = ("ada", "bo")
HANG_S = 240  # a bound on a hang only: every wait below ends on the event it waits for


def hold(port: int) -> list[socket.socket]:
    """Bind UDP 127.0.0.1:port and port+1 (the rendezvous' two), so that no other process takes them."""
    held: list[socket.socket] = []
    try:
        for p in (port, port + 1):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            held.append(s)
            s.bind(("127.0.0.1", p))
    except OSError as exc:
        for s in held:
            s.close()
        raise AssertionError(f"port {port} or {port + 1} was taken the moment the rendezvous exited: {exc}") from None
    return held


def taken(port: int) -> bool:
    """Whether another process binding UDP 127.0.0.1:port now would find it in use."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
        return False


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def rendezvous_on(held: list[socket.socket]) -> Iterator[list[str]]:
    """The real rendezvous server, started in a thread of this process on the held sockets; yields its log lines.

    RendezvousServer.start binds each of its addresses through the loop: this loop's bind adopts the socket
    held for that address instead, after dropping what members sent to it while nobody read it (a new
    rendezvous process would never have seen those datagrams).
    """
    from rendezvous.server import RendezvousServer

    by_address = {s.getsockname(): s for s in held}
    for s in held:
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                s.recv(65536)
    loop = asyncio.new_event_loop()
    bind = loop.create_datagram_endpoint

    async def adopt(factory, local_addr=None, **kwargs):  # type: ignore[no-untyped-def]
        return await bind(factory, sock=by_address.pop(local_addr))

    loop.create_datagram_endpoint = adopt  # type: ignore[method-assign]
    logger, lines = logging.getLogger("kafila.rendezvous"), _Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    port = min(p for _, p in by_address)
    server = RendezvousServer("127.0.0.1", port)
    thread = threading.Thread(target=loop.run_forever, name="rendezvous", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(HANG_S)
        assert not by_address, by_address  # every address it serves on is one held since the kill
        yield lines.lines
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(HANG_S)
        loop.close()
        logger.removeHandler(lines)
        logger.setLevel(level)
        for s in held:
            s.close()


def wait_lines(lines: list[str], pattern: re.Pattern[str], count: int) -> None:
    """Until `count` of `lines` match `pattern` (bounded against a hang only)."""
    deadline = time.monotonic() + HANG_S
    while sum(bool(pattern.search(line)) for line in list(lines)) < count:
        assert time.monotonic() < deadline, lines
        time.sleep(0.2)


@pytest.fixture(scope="module")
def capital(smollm: Path) -> str:
    return llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)


def test_rendezvous_killed_with_an_all_direct_ring_serving_goes_on(tmp_path: Path, capital: str) -> None:
    with Cluster(tmp_path, [(n, ["--api-port", "0"]) for n in MEMBERS]) as cluster:
        state = cluster.wait_phase({"admitted"})
        assert state["edges"] and all(e["state"] == "direct" for e in state["edges"]), state["edges"]
        urls = {"host": cluster.url, **{n: cluster.member_url(n) for n in MEMBERS}}
        rdv = cluster.procs[0]
        rdv.popen.kill()  # kill -9
        rdv.popen.wait()
        held = hold(cluster.port)  # at once: from here to its return, no other process can take its address
        assert taken(cluster.port) and taken(cluster.port + 1)
        reply = cluster.chat(PROMPT, MAX_TOKENS)  # at once: serving never waits on the rendezvous
        assert reply["choices"][0]["message"]["content"] == capital, reply
        for name, url in urls.items():  # everybody notices, and says so; the session goes on
            state = cluster.wait_state(url, lambda s: s["rendezvous_unreachable"] is not None, HANG_S)
            assert "unreachable" in state["rendezvous_unreachable"] and state["phase"] == "admitted", (name, state)
            assert "0 relayed link(s)" in state["rendezvous_unreachable"], state["rendezvous_unreachable"]
        for name in MEMBERS:  # the ring serves through every member's API, long after the rendezvous went
            reply = cluster.chat(PROMPT, MAX_TOKENS, url=urls[name])
            assert reply["choices"][0]["message"]["content"] == capital, (name, reply)
        assert all(p.popen.poll() is None for p in cluster.procs[1:]), "a process exited"
        assert taken(cluster.port) and taken(cluster.port + 1)  # still ours, however long that took
        # a rendezvous comes back on the same address, empty: each process creates the session there again
        # (the first) or joins it, and announces itself again
        with rendezvous_on(held) as back:
            for url in urls.values():
                cluster.wait_state(url, lambda s: s["rendezvous_unreachable"] is None, HANG_S)
            wait_lines(back, re.compile(r"created again"), 1)
            wait_lines(back, re.compile(r"member \w+ joined"), 1 + len(MEMBERS))
            for text in ("Traceback", "internal error"):
                assert all(text not in p.output for p in cluster.procs), text
            reply = cluster.chat(PROMPT, MAX_TOKENS)
            assert reply["choices"][0]["message"]["content"] == capital, reply
            problems = cluster.stop()  # the session's processes first, the rendezvous last, as before
            assert not problems, problems

"""Asyncio adapter for RendezvousCore: binds the UDP sockets and only pumps datagrams."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from kafila.errors import NetworkError
from kafila.net.udp import set_buffers
from rendezvous.core import Addr, Limits, RendezvousCore

log = logging.getLogger("kafila.rendezvous")


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, server: RendezvousServer, local: Addr) -> None:
        self.server, self.local = server, local
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.server.dispatch(data, (addr[0], addr[1]), self.local)

    def error_received(self, exc: Exception) -> None:
        log.debug("socket %s: %s", self.local, exc)  # ICMP errors from vanished members: harmless


def _large_buffers(sock: _Socket) -> None:
    """Kernel buffers as large as the members' (kafila.net.udp): the default 208 KiB holds a few hundred
    datagrams, and a burst of joins outran it (the loopback load test lost ~100 datagrams a run,
    among them a probe that was then never answered)."""
    assert sock.transport is not None
    try:
        set_buffers(sock.transport.get_extra_info("socket"))  # the kernel caps them at net.core.[rw]mem_max
    except OSError as exc:
        log.debug("socket %s: buffer size not set: %s", sock.local, exc)


class RendezvousServer:
    """Serves UDP on host:port and host:port+1 (and alt_ip on both ports when given)."""

    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = 3478,
        alt_ip: str | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
        core_factory: Callable[[list[Addr], Limits | None], RendezvousCore] = RendezvousCore,
    ) -> None:
        self.host, self.port, self.alt_ip = host, port, alt_ip
        self.limits = limits
        self.clock = clock
        self.core_factory = core_factory  # tests swap in a hostile core
        self.core: RendezvousCore | None = None
        self._sockets: dict[Addr, _Socket] = {}

    async def start(self) -> None:
        """Bind every socket; NetworkError when one is taken."""
        loop = asyncio.get_running_loop()
        ips = [self.host] + ([self.alt_ip] if self.alt_ip else [])
        port = self.port
        if not 1 <= port <= 65534:
            raise NetworkError(f"rendezvous port {port} must be in 1..65534 (the probe also uses port+1)")
        try:
            for ip in ips:
                for p in (port, port + 1):
                    sock = _Socket(self, (ip, p))
                    await loop.create_datagram_endpoint(lambda s=sock: s, local_addr=(ip, p))  # type: ignore[misc]
                    self._sockets[(ip, p)] = sock
                    _large_buffers(sock)
        except OSError as exc:
            self.close()
            raise NetworkError(f"cannot bind the rendezvous on {ips} ports {port},{port + 1}: {exc}") from None
        self.core = self.core_factory(list(self._sockets), self.limits)
        log.info("rendezvous listening on %s", ", ".join(f"{ip}:{p}" for ip, p in self._sockets))

    def dispatch(self, data: bytes, src: Addr, local: Addr) -> None:
        """Feed one datagram to the core and send what it answers."""
        if self.core is None:
            return
        for out, via, dst in self.core.handle(data, src, local, self.clock()):
            sock = self._sockets.get(via)
            if sock is not None and sock.transport is not None:
                sock.transport.sendto(out, dst)

    def close(self) -> None:
        """Close every socket."""
        for s in self._sockets.values():
            if s.transport is not None:
                s.transport.close()
        self._sockets.clear()

    async def serve_forever(self, stats_every_s: float = 60.0) -> None:
        """Run until cancelled, logging counters now and then."""
        await self.start()
        try:
            while True:
                await asyncio.sleep(stats_every_s)
                if self.core is not None:
                    self.core.expire(self.clock())
                    st = self.core.stats
                    log.info(
                        "sessions=%d probes=%d requests=%d rejoins=%d relayed=%d (%d bytes) dropped=%d malformed=%d "
                        "limited=%d", len(self.core.sessions), st.probes, st.requests, st.rejoins, st.relayed,
                        st.relayed_bytes, st.dropped, st.malformed, st.rate_limited,
                    )
        finally:
            self.close()

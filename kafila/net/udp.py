"""The endpoint's UDP socket: every datagram waiting at a wake-up is read at once and handed over as one batch.

An activation row spans several QUIC packets. asyncio's datagram transport reads one datagram per
event-loop turn, so the endpoint drove QUIC (acknowledgements, timers, sends) once per packet;
reading the whole batch first lets it act about once per message (with the endpoint's other
changes, the CPU of an echo of one activation row fell by ~40%; on a shared machine that CPU is
taken from the other stages' llama.cpp threads).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]
MAX_BATCH = 64  # datagrams per wake-up, so one busy peer cannot starve the loop
MAX_DATAGRAM = 65535


class UdpSocket:
    """A non-blocking UDP socket on an event loop; `on_batch` gets [(data, addr), ...] per wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bind: Addr,
                 on_batch: Callable[[list[tuple[bytes, Addr]]], None]) -> None:
        self._loop = loop
        self._on_batch = on_batch
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setblocking(False)
            self.sock.bind(bind)
        except OSError:
            self.sock.close()
            raise
        name = self.sock.getsockname()
        self.local_addr: Addr = (name[0], name[1])
        self.closed = False
        loop.add_reader(self.sock.fileno(), self._read_ready)

    def _read_ready(self) -> None:
        batch: list[tuple[bytes, Addr]] = []
        for _ in range(MAX_BATCH):
            try:
                data, addr = self.sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # ICMP unreachable from a punch target: expected
                log.debug("socket error: %s", exc)
                continue
            batch.append((data, (addr[0], addr[1])))
        if batch:
            self._on_batch(batch)

    def sendto(self, data: bytes, addr: Addr) -> None:
        """Send now, or drop when the kernel's buffer is full (UDP semantics; QUIC retransmits)."""
        if self.closed:
            return
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            log.debug("send buffer full: dropped a %d-byte datagram to %s", len(data), addr)
        except OSError as exc:
            log.debug("send to %s failed: %s", addr, exc)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()

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
import sys
from collections import deque
from collections.abc import Callable

from kafila.net.rate import RateQueue

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]
MAX_BATCH = 64  # datagrams per wake-up, so one busy peer cannot starve the loop
MAX_DATAGRAM = 65535
# Kernel socket buffers (the kernel caps them at net.core.[rw]mem_max, 4 MiB here). The default 208 KiB
# receive buffer holds ~90 datagrams, a few milliseconds of a stage delivery: a receiver that is busy
# (hashing a chunk, or not scheduled on a shared machine) for longer lost datagrams, and every loss
# halves the sender's congestion window.
SOCKET_BUFFER = 4 * 1024 * 1024


def _never_fragment(sock: socket.socket) -> None:
    """Set don't-fragment on every datagram, whatever the kernel believes the path MTU to be (Linux).

    Path MTU probes (kafila.net.pmtu) must fail when too big: by default Linux fragments a datagram
    bigger than the route's MTU, and a probe that arrives in fragments would raise the size past what
    the path carries whole. IP_PMTUDISC_PROBE also ignores the kernel's own guess (from ICMP), which
    the probes replace. Where the option does not exist datagrams stay at 1,200 bytes unless a probe
    of a larger size is acknowledged, which a fragmenting path can still do: a cost, never a stall.
    """
    if sys.platform.startswith("linux"):  # Python 3.11 names neither constant: linux/in.h's values
        try:
            sock.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_MTU_DISCOVER", 10),
                            getattr(socket, "IP_PMTUDISC_PROBE", 3))
        except OSError as exc:
            log.debug("cannot set don't-fragment: %s", exc)


def set_buffers(sock: socket.socket) -> None:
    """Ask for SOCKET_BUFFER-sized kernel receive and send buffers on `sock` (OSError when refused)."""
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)


def route_payload_limit(addr: Addr) -> int | None:
    """The largest UDP payload the local route toward `addr` carries whole: its MTU less the IPv4 (20) and UDP
    (8) headers, as the kernel knows it (the interface's, or a smaller one learnt from ICMP); None where the
    system cannot tell. Only picks the route: no packet is sent."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            mtu = s.getsockopt(socket.IPPROTO_IP, getattr(socket, "IP_MTU", 14))  # linux/in.h: IP_MTU = 14
    except OSError as exc:
        log.debug("no route MTU toward %s: %s", addr, exc)
        return None
    return mtu - 28 if mtu > 28 else None


class UdpSocket:
    """A non-blocking UDP socket on an event loop; `on_batch` gets [(data, addr), ...] per wake-up.

    `delay_s` (EMULATION): every datagram leaves that much later, in the order it was sent, as over a link to a
    far member (this kernel has no netem); the peers' QUIC then measures the round trip a WAN would have.
    `send_rate` and `receive_rate` (EMULATION, `--link-rate`): the uplink and downlink of a home connection,
    each a net.rate.RateQueue that datagrams wait in (or are dropped by, when it is full) before they leave
    or are handed over.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, bind: Addr,
                 on_batch: Callable[[list[tuple[bytes, Addr]]], None], delay_s: float = 0.0,
                 send_rate: RateQueue | None = None, receive_rate: RateQueue | None = None) -> None:
        self._loop = loop
        self._on_batch = on_batch
        self.delay_s = delay_s
        self.send_rate, self.receive_rate = send_rate, receive_rate
        self._held: deque[tuple[float, bytes, Addr]] = deque()  # (when it leaves, datagram, to)
        self._release: asyncio.TimerHandle | None = None
        self._inbox: deque[tuple[float, bytes, Addr]] = deque()  # (when it is handed over, datagram, from)
        self._deliver: asyncio.TimerHandle | None = None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.setblocking(False)
            _never_fragment(self.sock)
            set_buffers(self.sock)
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
        if self.receive_rate is not None:
            batch = self._through_downlink(batch)
        if batch:
            self._on_batch(batch)

    def _through_downlink(self, batch: list[tuple[bytes, Addr]]) -> list[tuple[bytes, Addr]]:
        """EMULATION: the datagrams the emulated downlink hands over now; the rest wait in `_inbox` or drop."""
        assert self.receive_rate is not None
        now, ready = self._loop.time(), []
        for data, addr in batch:
            at = self.receive_rate.depart(len(data), now)
            if at is None:
                continue  # the downlink's queue is full: dropped, as a router drops
            if at <= now and not self._inbox:
                ready.append((data, addr))
            else:
                self._inbox.append((at, data, addr))
        if self._inbox and self._deliver is None:
            self._deliver = self._loop.call_at(self._inbox[0][0], self._hand_over)
        return ready

    def _hand_over(self) -> None:
        self._deliver = None
        until = max(self._inbox[0][0], self._loop.time())
        batch = []
        while self._inbox and self._inbox[0][0] <= until:
            _, data, addr = self._inbox.popleft()
            batch.append((data, addr))
        if self._inbox:
            self._deliver = self._loop.call_at(self._inbox[0][0], self._hand_over)
        if batch and not self.closed:
            self._on_batch(batch)

    def sendto(self, data: bytes, addr: Addr) -> None:
        """Send now (or after the emulated delay), or drop when the kernel's buffer is full (UDP semantics; QUIC
        retransmits)."""
        if self.closed:
            return
        now = self._loop.time()
        leave = now
        if self.send_rate is not None:  # EMULATION: the uplink
            at = self.send_rate.depart(len(data), now)
            if at is None:
                return  # its queue is full: dropped, as a router drops
            leave = at
        leave += self.delay_s
        if leave > now or self._held:  # in the order sent: departures only grow (RateQueue), the delay is fixed
            self._held.append((leave, data, addr))
            if self._release is None:
                self._release = self._loop.call_at(self._held[0][0], self._send_held)
            return
        self._send(data, addr)

    def _send_held(self) -> None:
        self._release = None
        # the datagram this timer was set for leaves even if asyncio fired a hair early
        until = max(self._held[0][0], self._loop.time())
        while self._held and self._held[0][0] <= until:
            _, data, addr = self._held.popleft()
            self._send(data, addr)
        if self._held:
            self._release = self._loop.call_at(self._held[0][0], self._send_held)

    def _send(self, data: bytes, addr: Addr) -> None:
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            log.debug("send buffer full: dropped a %d-byte datagram to %s", len(data), addr)
        except OSError as exc:
            log.debug("send to %s failed: %s", addr, exc)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for timer in (self._release, self._deliver):
                if timer is not None:
                    timer.cancel()
            self._held.clear()
            self._inbox.clear()
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()

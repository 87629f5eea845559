"""EMULATION: a link's bandwidth as a token bucket in front of a short queue (`--link-rate MBIT`).

This kernel has no netem, so a member's uplink and downlink are emulated in the endpoint's UDP socket
(net.udp.UdpSocket), as `--link-delay` emulates distance. Each direction holds a RateQueue: a datagram
leaves when the bucket has tokens for it (`burst` bytes fill at `rate` bytes/s); while it has none,
datagrams wait in line, as behind a home router's modem; a datagram that would wait longer than
`max_wait_s` is dropped, as a router's full buffer drops, so QUIC's congestion control finds the rate
as it would on the real link. Sans-I/O: the caller passes the time and schedules the departures.

The accounting is exact: over any interval of length T, the bytes let through never exceed
burst + rate * T (`passed` counts them; the tests check this bound on real sockets).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
DEFAULT_BURST = 16 * 1024  # about a dozen full-size datagrams: a link lets a few through back to back
DEFAULT_WAIT_S = 0.1  # a modem's queue: 100 ms of the link's bytes at most


@dataclass
class RateQueue:
    """Departure times for datagrams through a link of `rate` bytes/s (see the module's docstring)."""

    rate: float
    burst: float = DEFAULT_BURST
    max_wait_s: float = DEFAULT_WAIT_S
    passed: int = 0  # bytes given a departure time
    dropped: int = 0  # bytes refused (the queue was full)
    _free_at: float = field(default=float("-inf"))  # when the line ahead has left and the bucket is full

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.burst < 0 or self.max_wait_s < 0:
            raise ValueError(f"a link rate must be positive, got {self.rate} bytes/s")

    def _drained(self, n: int, now: float) -> float:
        return max(self._free_at, now - self.burst / self.rate) + n / self.rate

    def admits(self, n: int, now: float) -> bool:
        """Whether a datagram of `n` bytes offered at `now` would be given a departure (nothing is counted)."""
        return self._drained(n, now) - now <= self.max_wait_s

    def depart(self, n: int, now: float) -> float | None:
        """When a datagram of `n` bytes offered at `now` leaves (>= now), or None when it is dropped.

        `_free_at` is the virtual time at which every byte accepted so far has drained at `rate`; an idle
        link's credit is capped at `burst` bytes (it is never earlier than now - burst / rate). The datagram
        leaves once its own bytes have drained: then the bucket held tokens for them."""
        drained = self._drained(n, now)
        leave = max(now, drained)
        if leave - now > self.max_wait_s:
            self.dropped += n
            return None
        self._free_at = drained
        self.passed += n
        return leave


async def paced(queue: RateQueue, n: int) -> None:
    """EMULATION: return once `n` bytes of a stream (an HTTP download) have passed `queue`, sharing it with the
    datagrams: a stream's bytes wait for room in pieces the queue takes, never dropped (TCP would resend them)."""
    loop = asyncio.get_running_loop()
    piece = max(1, int(queue.rate * queue.max_wait_s / 2))  # a piece always fits an empty queue's wait
    while n > 0:
        take = min(n, piece)
        now = loop.time()
        leave = queue.depart(take, now) if queue.admits(take, now) else None
        if leave is None:  # the queue is full of datagrams: wait for half of it to drain
            await asyncio.sleep(queue.max_wait_s / 2)
            continue
        n -= take
        await asyncio.sleep(max(0.0, leave - loop.time()))


MAX_MBIT = 100_000.0  # 100 Gbit/s: past any link a member has

@dataclass(frozen=True)
class LinkRate:
    """EMULATION: a member's uplink and downlink in Mbit/s (`--link-rate UP[/DOWN]`; 0: not limited)."""

    up_mbit: float
    down_mbit: float
    # one queue per direction for every endpoint given this LinkRate: a host's coordinator and its own member
    # share one machine's uplink, as they would share a home connection
    _queues: dict[str, RateQueue] = field(default_factory=dict, compare=False, repr=False, hash=False)

    @classmethod
    def parse(cls, text: str) -> LinkRate:
        """`80` (both ways) or `80/160` (up/down); ValueError naming the flag otherwise."""
        parts = text.split("/")
        try:
            up, down = (float(parts[0]), float(parts[-1])) if len(parts) <= 2 else (-1.0, -1.0)
        except ValueError:
            up = down = -1.0
        if not (0 < up <= MAX_MBIT and 0 < down <= MAX_MBIT):
            raise ValueError(f"--link-rate is Mbit/s (EMULATION), one number or UP/DOWN, each above 0 and at most "
                             f"{MAX_MBIT:g}; got {text!r}")
        return cls(up, down)

    def uplink(self) -> RateQueue:
        return self._queues.setdefault("up", RateQueue(self.up_mbit * MBIT))

    def downlink(self) -> RateQueue:
        return self._queues.setdefault("down", RateQueue(self.down_mbit * MBIT))

    def label(self) -> str:
        """How it shows wherever it shows: marked as emulated."""
        if self.up_mbit == self.down_mbit:
            return f"{self.up_mbit:g} Mbit/s (emulated)"
        return f"{self.up_mbit:g} up / {self.down_mbit:g} down Mbit/s (emulated)"

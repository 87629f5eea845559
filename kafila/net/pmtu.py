"""Path MTU search for one QUIC connection (DPLPMTUD, RFC 8899), sans-I/O: sizes in, sizes out, no clock of its own.

QUIC must work with 1,200-byte datagrams (RFC 9000 §14) and aioquic sends exactly that. Most paths carry
1,452 (1,500-byte Ethernet less IPv6 and UDP headers), and bigger datagrams are fewer packets to build,
encrypt and acknowledge: aioquic's own one-way rate on one connection here was 24.5 MB/s at 1,200 bytes and
34.6 MB/s at 1,452. Each path is searched up to its own ceiling (RFC 8899 §5.1.2: MAX_PLPMTU comes from the
local interface): the caller gives the local route's MTU less the IP and UDP headers (1,472 on 1,500-byte
Ethernet, 8,972 with jumbo frames, 16,383 on loopback, where aioquic's 2-byte frame lengths stop it), or
DEFAULT_CEILING where the route is unknown and for the relay, whose frames are bounded. On one machine the
ring's activations then cross in a handful of datagrams instead of a dozen per row (an 8B-shaped ring's
members spent ~30 % less CPU on networking per token).

A size is never assumed: the connection sends a probe (one PING padded to the candidate size, never
fragmented: the socket sets don't-fragment) and its datagram size is raised only once the peer
acknowledges a probe of that size. A size whose probe is lost `max_probes` times in a row does not fit;
the search then halves the gap between the largest size acknowledged and the smallest that failed until
it is under `step` bytes (RFC 8899 §5.3.2 leaves the search method open). The first candidate is the
ceiling, since most paths carry their route's size: one round trip settles the common case.

A new path (the edge moved between the relay and a direct path) starts again from the base. A black hole (the
connection's loss timer fired `black_hole_ptos` times in a row at a raised size, or `black_hole_losses` datagrams
over the base were lost with none acknowledged between: the path shrank, or a probe was acknowledged by luck;
the second catches a path that still carries small datagrams, whose acknowledgements keep the loss timer
from firing) falls back to the base at once and searches again after `raise_s`. A search that
ended below the largest size is retried after `raise_s` too (RFC 8899 PMTU_RAISE_TIMER).

Transitions:

    state      event                                   -> state      action
    idle       start(now, ceiling) / path changed      -> searching  size = base, candidate = high = ceiling
    searching  probe of the candidate acknowledged     -> searching  size = low = candidate (caller raises the
                                                                     connection's datagram size), next candidate
    searching  probe lost, fewer than max_probes times -> searching  probe the same size again
    searching  probe lost max_probes times             -> searching  high = candidate - 1, next candidate
    searching  high - low < step                       -> done       (raise timer armed when size < ceiling)
    done       raise timer                             -> searching  low = size, high = ceiling
    any        black hole                              -> done       size = base, raise timer armed
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

BASE = 1200  # RFC 9000 §14: every QUIC path carries this
DEFAULT_CEILING = 1452  # a path of unknown route, and the relay: 1,500 less a 40-byte IPv6 and an 8-byte UDP header
# aioquic 1.7.2 writes STREAM and CRYPTO frame lengths and long-header packet lengths as 2-byte varints
# (`push_uint16(n | 0x4000)`): a bigger datagram's frames corrupt ("Unknown frame type" at the peer)
LIMIT = 16383


@dataclass(frozen=True)
class PmtuConfig:
    """Bounds and pace of the search (sizes are UDP payload bytes, i.e. whole QUIC datagrams)."""

    base: int = BASE
    maximum: int = LIMIT  # no path is searched above this, whatever its ceiling
    step: int = 16  # the search stops when the unknown gap is smaller than this
    max_probes: int = 3  # RFC 8899 MAX_PROBES: losses in a row before a size counts as too big
    raise_s: float = 600.0  # RFC 8899 PMTU_RAISE_TIMER: search again this long after settling below the ceiling
    black_hole_ptos: int = 3  # loss timeouts in a row at a raised size that mean the path no longer carries it
    black_hole_losses: int = 12  # datagrams over the base lost in a row (none acknowledged between): the same

    def __post_init__(self) -> None:
        if not BASE <= self.base <= self.maximum <= LIMIT:
            raise ValueError(f"path MTU bounds must satisfy {BASE} <= base <= maximum <= {LIMIT}, "
                             f"got {self.base}..{self.maximum}")
        if min(self.step, self.max_probes, self.black_hole_ptos, self.black_hole_losses) < 1:
            raise ValueError("step, max_probes, black_hole_ptos and black_hole_losses must be at least 1")


class PmtuState(Enum):
    IDLE = "idle"
    SEARCHING = "searching"
    DONE = "done"


class PmtuSearch:
    """The search on one connection's current path; `size` is what the connection may send now."""

    def __init__(self, config: PmtuConfig | None = None) -> None:
        self.config = config or PmtuConfig()
        self.state = PmtuState.IDLE
        self.size = self.config.base
        self.generation = 0  # bumped on every restart: outcomes of older probes are ignored
        self._low = self._high = self.config.base
        self.ceiling = min(DEFAULT_CEILING, self.config.maximum)  # this path's largest size worth probing
        self._candidate: int | None = None
        self._in_flight = False
        self._losses = 0
        self._raise_at: float | None = None
        self.probes_sent = 0

    # ---- inputs ------------------------------------------------------------------------------

    def start(self, now: float, ceiling: int = DEFAULT_CEILING) -> None:
        """Search from the base up to `ceiling` (a new connection, or a new path: nothing about the old one holds)."""
        self.ceiling = max(self.config.base, min(ceiling, self.config.maximum))
        self.size = self.config.base
        self._search(self.config.base)

    def on_acked(self, size: int, generation: int, now: float) -> None:
        """A probe of `size` bytes reached the peer: the path carries it."""
        if not self._mine(size, generation):
            return
        self._in_flight, self._losses = False, 0
        self.size = self._low = size
        self._next(now)

    def on_lost(self, size: int, generation: int, now: float) -> None:
        """A probe of `size` bytes was declared lost."""
        if not self._mine(size, generation):
            return
        self._in_flight = False
        self._losses += 1
        if self._losses >= self.config.max_probes:
            self._losses = 0
            self._high = size - 1
            self._next(now)

    def on_black_hole(self, now: float) -> None:
        """The path stopped carrying the raised size: back to the base, search again later."""
        self.generation += 1
        self.size = self._low = self._high = self.config.base
        self._candidate, self._in_flight, self._losses = None, False, 0
        self.state = PmtuState.DONE
        self._raise_at = now + self.config.raise_s

    # ---- outputs -----------------------------------------------------------------------------

    def probe_due(self, now: float) -> int | None:
        """The size to probe now (the caller sends one probe of it), or None."""
        if self.state is PmtuState.DONE and self._raise_at is not None and now >= self._raise_at:
            self._search(self.size)
        if self.state is not PmtuState.SEARCHING or self._in_flight or self._candidate is None:
            return None
        self._in_flight = True
        self.probes_sent += 1
        return self._candidate

    def next_wakeup(self) -> float | None:
        """When probe_due() next has something to do by itself (the raise timer)."""
        return self._raise_at if self.state is PmtuState.DONE else None

    @property
    def raised(self) -> bool:
        """True while the connection sends more than the base size."""
        return self.size > self.config.base

    # ---- internals -----------------------------------------------------------------------------

    def _mine(self, size: int, generation: int) -> bool:
        return (generation == self.generation and self.state is PmtuState.SEARCHING and self._in_flight
                and size == self._candidate)

    def _search(self, low: int) -> None:
        self.generation += 1
        self.state = PmtuState.SEARCHING
        self._low, self._high = low, self.ceiling
        self._in_flight, self._losses, self._raise_at = False, 0, None
        self._candidate = self._high if self._high > low else None
        if self._candidate is None:
            self.state = PmtuState.DONE

    def _next(self, now: float) -> None:
        """The next candidate: the middle of the unknown gap; done when the gap is small."""
        if self._high - self._low < self.config.step:
            self._candidate, self.state = None, PmtuState.DONE
            self._raise_at = now + self.config.raise_s if self.size < self.ceiling else None
            return
        self._candidate = (self._low + self._high + 1) // 2

"""Which direct path carries a member's QUIC packets: a punch only proposes an address (kafila.net.punch);
the core moves packets there once a connection to that member validated it (issue #56 item 1).

Validation is QUIC's own (RFC 9000 §8.2): a PATH_CHALLENGE built with an established, pinned connection's
keys goes to the proposed address itself, and only a peer that read it there can answer the PATH_RESPONSE
(kafila.net.quic_probes). Until then, and again whenever the punch falls back, packets go by the relay, and
the caller is told PUNCHING, not DIRECT.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kafila.net.events import PathChanged
from kafila.net.punch import Puncher, PunchState

log = logging.getLogger("kafila.net")
Addr = tuple[str, int]


@dataclass
class DirectPaths:
    """Per peer: the proposed direct address a connection validated (and when), and what the caller was told."""

    allow_direct: bool = True
    retry_s: float = 0.2  # an unanswered challenge is sent again this much later, doubling each time...
    max_retry_s: float = 5.0  # ...up to this (an address that never answers costs a 1,200-byte datagram per 5 s)
    _proven: dict[bytes, tuple[Addr, float]] = field(default_factory=dict)
    _next: dict[bytes, tuple[float, float]] = field(default_factory=dict)  # when the next challenge goes, the gap
    _reported: dict[bytes, PunchState] = field(default_factory=dict)  # the path state last told, per peer

    def proposed(self, p: Puncher) -> Addr | None:
        """The direct address the punch proved both ways (validated by a connection, or not yet)."""
        return p.direct if self.allow_direct and p.state == PunchState.DIRECT else None

    def route(self, p: Puncher | None) -> Addr | None:
        """Where packets to p's peer go straight: the proposed address once validated, else None (the relay)."""
        if p is None or (proposed := self.proposed(p)) is None:
            return None
        proven = self._proven.get(p.peer)
        return proposed if proven is not None and proven[0] == proposed else None

    def pending(self, p: Puncher | None) -> bool:
        """True while the punch proposes a direct address no connection has validated yet."""
        return p is not None and self.proposed(p) is not None and self.route(p) is None

    def outcome(self, p: Puncher) -> tuple[bool, float | None]:
        """(settled, when the direct path was validated): settled once relayed for good, idle, or validated."""
        direct = self.route(p)
        at = self._proven[p.peer][1] if direct is not None else None
        return p.state in (PunchState.IDLE, PunchState.RELAY) or direct is not None, at

    def due(self, p: Puncher, now: float, ready: bool = True) -> Addr | None:
        """The address to challenge now, if a challenge is due and the caller is `ready` to send one (a connection
        to the peer is established); the next one is then scheduled, later each time."""
        proposed = self.proposed(p)
        if proposed is None:
            self._proven.pop(p.peer, None)  # the punch fell back: a new proposal is validated afresh
            self._next.pop(p.peer, None)
            return None
        at, gap = self._next.get(p.peer, (now, self.retry_s / 2))
        if not ready or self.route(p) is not None or now < at:
            return None
        gap = min(2 * gap, self.max_retry_s)
        self._next[p.peer] = (now + gap, gap)
        return proposed

    def next_wakeup(self, p: Puncher) -> float | None:
        """When due() next says yes, while the proposed address waits for its validation."""
        return self._next[p.peer][0] if self.pending(p) and p.peer in self._next else None

    def confirm(self, p: Puncher, answered: list[Addr], now: float) -> bool:
        """A connection's challenges to these addresses were answered: True when that makes the proposed one the
        route."""
        proposed = self.proposed(p)
        if proposed is None or proposed not in answered or self.route(p) is not None:
            return False
        self._proven[p.peer] = (proposed, now)
        self._next.pop(p.peer, None)
        return True

    def change(self, p: Puncher) -> PathChanged | None:
        """The change to tell the caller, if any: DIRECT only once validated; one proposed, unproven is PUNCHING."""
        direct = self.route(p)
        state = p.state if p.state != PunchState.DIRECT or direct is not None else PunchState.PUNCHING
        before = self._reported.get(p.peer, PunchState.IDLE)
        if state == before:
            return None
        self._reported[p.peer] = state
        log.info("path to %s: %s -> %s %s", p.peer.hex()[:8], before.value, state.value, direct or "")
        return PathChanged(p.peer, before, state, direct)

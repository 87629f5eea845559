"""Hole punching toward one peer, as a sans-I/O state machine (datagrams out, `now` in).

Both sides send MAC'd PUNCH frames to every candidate address of the other (the address the
rendezvous saw in its probe, its LAN address, the address the rendezvous relays to) every
`interval_s`, and answer every PUNCH with a PUNCH_ACK sent to the address the PUNCH really
came from (the "reflexive" answer: it is what lets a permissive member reach a restrictive one,
whose mapping toward us is not the one anybody announced). Addresses punches came from become
candidates too. The first PUNCH_ACK heard proves both directions work: that address becomes the
direct path. A PUNCH_GO sent through the relay tells the peer to start at the same moment.

Sender authentication (issue #56 item 1): the MAC key is the pair's own (kafila.net.trust.pair_punch_key:
X25519 between the two members' announced keys), so a third member of the session can make no frame
"from" either of them. The announced candidates are always tried; addresses learned from verified
punches fill the remaining slots, newest kept, and never evict an announced one. A direct path is only
a proposal to the core: it moves a QUIC connection there after the connection's own path validation.

The relay path is used meanwhile, so nobody waits for this to finish. Once direct, a PUNCH every
`keepalive_s` keeps the NAT mappings open; if no ACK comes back for `lost_after_s`, the path
falls back to the relay.

Freshness (issue #13 item 4): every frame carries its sender's stamp (ms, strictly increasing)
under the MAC. A frame is acted on only once, and only while its stamp is within `replay_window_s`
of the newest stamp heard from that peer; anything else (a replay, a stale capture) changes
nothing and sends nothing. A PUNCH_ACK counts only when it echoes the nonce of a PUNCH this side
sent within `ack_window_s`, and comes from the very address that PUNCH was sent to, so a
replayed ACK from elsewhere pins nothing.

Transitions:

    state     event                          -> state     action
    IDLE      start() / PUNCH / PUNCH_GO     -> PUNCHING  punch all candidates, PUNCH_GO via relay
    PUNCHING  PUNCH_ACK from addr            -> DIRECT    direct = addr
    PUNCHING  window over                    -> RELAY     stay on the relay
    RELAY     PUNCH / PUNCH_GO               -> PUNCHING  the peer tries again: punch again
    DIRECT    no ACK for lost_after_s        -> RELAY     fall back to the relay
    any       PUNCH from addr                -> (same)    PUNCH_ACK (and, unless DIRECT, a PUNCH) to addr;
                                                          addr becomes a candidate
    any       stale, replayed or unsolicited -> (same)    nothing
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from kafila.net import wire
from kafila.net.trust import punch_mac

Addr = tuple[str, int]
RELAY_PATH = ("relay", 0)  # pseudo-address: "send this through the rendezvous"


class PunchState(StrEnum):
    """Where the direct path to one peer stands."""

    IDLE = "idle"
    PUNCHING = "punching"
    DIRECT = "direct"
    RELAY = "relay"


@dataclass(frozen=True)
class PunchConfig:
    """Timings (seconds)."""

    interval_s: float = 0.05
    window_s: float = 3.0
    go_interval_s: float = 0.25
    keepalive_s: float = 5.0
    lost_after_s: float = 16.0
    max_candidates: int = 8
    replay_window_s: float = 5.0  # frames older than this (by the sender's own stamps) are stale
    ack_window_s: float = 3.0  # an ACK must answer a PUNCH sent at most this long ago
    max_issued: int = 1024  # PUNCH nonces awaiting an ACK (8 candidates every 50 ms for 3 s: ~500)


class Puncher:
    """The punch state toward one peer."""

    def __init__(
        self, me: bytes, peer: bytes, key: bytes, candidates: list[Addr], config: PunchConfig | None = None
    ) -> None:
        self.me, self.peer, self.key = me, peer, key  # key: the pair's (trust.pair_punch_key), not the session's
        self.config = config or PunchConfig()
        # the announced addresses (sealed announcement, rendezvous-seen): tried always, never evicted
        self.announced: list[Addr] = list(dict.fromkeys(candidates))[: self.config.max_candidates]
        self._learned: dict[Addr, None] = {}  # addresses verified punches came from, oldest first
        self.state = PunchState.IDLE
        self.direct: Addr | None = None
        self.started_at: float | None = None
        self.direct_at: float | None = None
        self._deadline = 0.0
        self._next_punch = 0.0
        self._next_go = 0.0
        self._last_ack = 0.0
        self._heard_from_peer = False
        self._stamp = -1  # the last stamp we sent
        self._issued: dict[bytes, tuple[Addr, float]] = {}  # PUNCH nonce -> (sent to, when), oldest first
        self._peer_high: int | None = None  # the newest stamp heard from the peer
        self._peer_seen: set[int] = set()  # stamps heard within the replay window

    @property
    def candidates(self) -> list[Addr]:
        """Every address punched: the announced ones, then those learned from verified punches."""
        return self.announced + list(self._learned)

    def _learn(self, addr: Addr) -> None:
        """A verified punch came from addr: keep it among the newest learned (the announced ones stay)."""
        if addr in self.announced:
            return
        self._learned.pop(addr, None)
        self._learned[addr] = None
        while self._learned and len(self.announced) + len(self._learned) > self.config.max_candidates:
            del self._learned[next(iter(self._learned))]

    def _frame(self, kind: int, now: float, dst: Addr, echo: bytes | None = None) -> tuple[bytes, Addr]:
        """A MAC'd frame to dst; a PUNCH's nonce is remembered so that only its ACK, from dst, counts."""
        self._stamp = max(self._stamp + 1, int(now * 1000))
        nonce = echo if echo is not None else secrets.token_bytes(wire.NONCE_LEN)
        mac = punch_mac(self.key, kind, self.me, self.peer, self._stamp, nonce)
        if kind == wire.PUNCH:
            self._issue(nonce, dst, now)
        return wire.encode_punch(wire.Punch(kind, self.me, self.peer, self._stamp, nonce, mac)), dst

    def _issue(self, nonce: bytes, dst: Addr, now: float) -> None:
        horizon = now - self.config.ack_window_s
        for old, (_addr, at) in list(self._issued.items()):  # oldest first: stop at the first still fresh
            if at >= horizon and len(self._issued) < self.config.max_issued:
                break
            del self._issued[old]
        self._issued[nonce] = (dst, now)

    def valid(self, p: wire.Punch) -> bool:
        """True when a frame is from our peer, to us, with a good MAC."""
        if p.sender != self.peer or p.receiver != self.me:
            return False
        return hmac.compare_digest(p.mac, punch_mac(self.key, p.kind, p.sender, p.receiver, p.stamp, p.nonce))

    def fresh(self, p: wire.Punch) -> bool:
        """True when a frame's stamp is new to us and within the replay window of the newest heard."""
        window_ms = int(self.config.replay_window_s * 1000)
        if p.stamp in self._peer_seen:
            return False
        return self._peer_high is None or p.stamp > self._peer_high - window_ms

    def _heard(self, stamp: int) -> None:
        """Record a stamp acted on; forget those that fell out of the window (they are refused by age now)."""
        if self._peer_high is None or stamp > self._peer_high:
            self._peer_high = stamp
            horizon = stamp - int(self.config.replay_window_s * 1000)
            if len(self._peer_seen) > 64:
                self._peer_seen = {s for s in self._peer_seen if s > horizon}
        self._peer_seen.add(stamp)

    def _acked(self, p: wire.Punch, src: Addr, now: float) -> bool:
        """True when an ACK answers a PUNCH we sent to src, recently; each PUNCH is answered once."""
        issued = self._issued.get(p.nonce)
        if issued is None or issued[0] != src or now - issued[1] > self.config.ack_window_s:
            return False
        del self._issued[p.nonce]
        return True

    def start(self, now: float) -> None:
        """Begin (or restart) punching."""
        if self.state in (PunchState.PUNCHING, PunchState.DIRECT):
            return
        self.state = PunchState.PUNCHING
        self.started_at = now
        self._deadline = now + self.config.window_s
        self._next_punch = now
        self._next_go = now

    def on_frame(self, p: wire.Punch, src: Addr, now: float) -> list[tuple[bytes, Addr]]:
        """Handle a punch-family frame (`src` is RELAY_PATH for relayed ones); invalid or stale ones do nothing."""
        if not self.valid(p) or not self.fresh(p):
            return []
        out: list[tuple[bytes, Addr]] = []
        if p.kind == wire.PUNCH_GO:
            self._heard_from_peer = True
            self.start(now)
        elif p.kind == wire.PUNCH and src != RELAY_PATH:
            self._heard_from_peer = True
            self._learn(src)
            out.append(self._frame(wire.PUNCH_ACK, now, src, echo=p.nonce))
            if self.state != PunchState.DIRECT:
                # punch straight back: the peer's NAT is open toward us now, so its ACK comes in one
                # round trip instead of waiting for our next scheduled punch
                out.append(self._frame(wire.PUNCH, now, src))
            self.start(now)
        elif p.kind == wire.PUNCH_ACK and src != RELAY_PATH:
            if not self._acked(p, src, now):
                return []  # not an answer to a PUNCH of ours, to this address, lately: pins nothing
            self._last_ack = now
            if self.state != PunchState.DIRECT:
                self.state = PunchState.DIRECT
                self.direct = src
                self.direct_at = now
        else:
            return []  # a relayed PUNCH or ACK proves nothing about a direct path
        self._heard(p.stamp)
        return out + self.poll(now)

    def poll(self, now: float) -> list[tuple[bytes, Addr]]:
        """Datagrams due at `now` (call whenever next_wakeup() passes)."""
        out: list[tuple[bytes, Addr]] = []
        c = self.config
        if self.state == PunchState.PUNCHING:
            if now >= self._deadline:
                self.state = PunchState.RELAY
                return out
            if now >= self._next_punch:
                out += [self._frame(wire.PUNCH, now, a) for a in self.candidates]
                self._next_punch = now + c.interval_s
            if now >= self._next_go and not self._heard_from_peer:
                out.append(self._frame(wire.PUNCH_GO, now, RELAY_PATH))
                self._next_go = now + c.go_interval_s
        elif self.state == PunchState.DIRECT and self.direct is not None:
            if now - self._last_ack > c.lost_after_s:
                self.state, self.direct = PunchState.RELAY, None
            elif now >= self._next_punch:
                out.append(self._frame(wire.PUNCH, now, self.direct))
                self._next_punch = now + c.keepalive_s
        return out

    def next_wakeup(self) -> float | None:
        """When poll() next has something to do."""
        if self.state == PunchState.PUNCHING:
            return min(self._next_punch, self._deadline, self._next_go if not self._heard_from_peer else self._deadline)
        if self.state == PunchState.DIRECT:
            return min(self._next_punch, self._last_ack + self.config.lost_after_s)
        return None

    @property
    def settled(self) -> bool:
        """True once punching has an outcome (direct, or given up)."""
        return self.state in (PunchState.DIRECT, PunchState.RELAY)

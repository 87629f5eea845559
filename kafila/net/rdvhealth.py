"""Whether the rendezvous still answers, sans-I/O: probed after silence, lost after more, back when heard.

Once joined, anything that comes from the rendezvous counts as hearing it. After `probe_s` of silence a
STUN Binding request goes to it once per `probe_s` (any answer counts); silent for `lost_after_s`, it is
lost, and the core closes the connections it relays (kafila.net.core). The next datagram from it brings
it back.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from kafila.net import stun
from kafila.net.events import RendezvousBack, RendezvousLost

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]


@dataclass
class RendezvousHealth:
    """The rendezvous's silence, timed by the caller's clock."""

    probe_s: float
    lost_after_s: float
    heard_at: float | None = None  # when something last came from the rendezvous (None: not joined)
    probed_at: float = float("-inf")  # when we last sent it a STUN probe to see if it lives
    lost: RendezvousLost | None = None  # while it is lost

    def joined(self, now: float) -> None:
        """It has just answered our join."""
        self.heard_at = now

    def timers(self) -> tuple[float | None, float | None]:
        """(when to probe the rendezvous next, when silence makes it lost); None, None when not joined or lost."""
        if self.heard_at is None or self.lost is not None:
            return None, None
        probe_at = max(self.heard_at, self.probed_at) + self.probe_s
        return probe_at, self.heard_at + self.lost_after_s

    def heard(self, rendezvous: Addr, now: float) -> RendezvousBack | None:
        """Something came from it; a RendezvousBack when it was lost until now."""
        assert self.heard_at is not None
        back = None
        if self.lost is not None:
            silent = now - self.heard_at
            self.lost = None
            log.info("the rendezvous %s:%d answers again after %.0f s", *rendezvous, silent)
            back = RendezvousBack(rendezvous, silent)
        self.heard_at = now
        return back

    def probe(self, now: float) -> bytes:
        """A STUN Binding request to send it now (its answer is only "heard")."""
        self.probed_at = now
        return stun.encode(stun.StunMessage(stun.BINDING_REQUEST, secrets.token_bytes(12)))

    def silent_for(self, now: float) -> float:
        """How long nothing has come from it."""
        assert self.heard_at is not None
        return now - self.heard_at

    def lose(self, rendezvous: Addr, relayed: int, now: float) -> RendezvousLost:
        """It is lost now, closing the `relayed` connections it carried: the event, with the reason they end."""
        silent = self.silent_for(now)
        ip, port = rendezvous
        reason = f"its relay, the rendezvous at {ip}:{port}, is lost (nothing heard from it for {silent:.0f} s)"
        self.lost = RendezvousLost(rendezvous, silent, reason, relayed)
        log.warning("the rendezvous %s:%d is silent for %.0f s: %d relayed connection(s) closed; direct ones go on",
                    ip, port, silent, relayed)
        return self.lost

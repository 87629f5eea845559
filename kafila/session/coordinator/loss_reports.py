"""Loss reports, confirmed before anyone is evicted: a sans-I/O machine the coordinator pumps.

A `lost` report reaches this machine only from the member it names or a ring neighbour of it
(protocol.authority checked the link it came on), and only for the epoch serving. A member that reports
itself lost is leaving: evicted at once. Any other report is a claim about someone else, so the coordinator
checks it on its own link to the member named: a QUIC ping acknowledged within the bound means the member
is there, and nobody is evicted (the reporter's ring edge broke, which a new plan over everyone mends); a
ping unanswered, or the link down, confirms the loss. So one member cannot evict another by saying so.
A reporter refuted REFUTED times within REFUTED_S is the member at fault (its own edges fail, or it lies):
it is evicted, so that no member can re-plan the ring at will.

    report(reporter, who, reason)  -> Evict (a self-report) | Probe (ping `who`) | nothing (one is pending)
    answered(who)                  -> Replan (nobody evicted) | Evict (the reporter, refuted again) | nothing
    unanswered(who, why)           -> Evict                   | nothing
    reset()                        a new epoch: reports pending for the old one are void
"""

from __future__ import annotations

from dataclasses import dataclass, field

REFUTED = 2  # a reporter refuted this many times ...
REFUTED_S = 3600.0  # ... within this long is evicted itself


@dataclass(frozen=True)
class Evict:
    """`who` is lost: end the epoch without it."""

    who: str
    reason: str
    confirmed: str = ""  # how the coordinator's own link confirmed a neighbour's report ("": a self-report)


@dataclass(frozen=True)
class Probe:
    """Ping `who` on the coordinator's own link, then tell the machine `answered` or `unanswered`."""

    who: str


@dataclass(frozen=True)
class Replan:
    """The ring broke and the member reported answers: end the epoch and plan again over everyone."""

    reason: str


Action = Evict | Probe | Replan


@dataclass
class LossReports:
    """The reports of this epoch waiting for the coordinator's own link to confirm them."""

    pending: dict[str, tuple[str, str]] = field(default_factory=dict)  # who → (reporter, reason), the first
    refuted: dict[str, list[float]] = field(default_factory=dict)  # reporter → when its reports were refuted

    def report(self, reporter: str, who: str, reason: str) -> list[Action]:
        """A report authority allowed (the member itself, or a ring neighbour of it)."""
        if reporter == who:  # it says it leaves, on its own link: nobody else's word
            return [Evict(who, reason)]
        if who in self.pending:  # its other neighbour's report adds nothing to the ping under way
            return []
        self.pending[who] = (reporter, reason)
        return [Probe(who)]

    def answered(self, who: str, now: float = 0.0) -> list[Action]:
        """`who` acknowledged the coordinator's ping: it is there."""
        if (pending := self.pending.pop(who, None)) is None:
            return []
        reporter, reason = pending
        times = self.refuted[reporter] = [t for t in self.refuted.get(reporter, []) if now - t < REFUTED_S] + [now]
        if len(times) >= REFUTED:
            del self.refuted[reporter]
            return [Evict(reporter, f"its loss reports were refuted {len(times)} times within {REFUTED_S:.0f} s "
                                    f"(the last: {who}, who answers the coordinator)")]
        return [Replan(f"{reporter} reported {who} lost ({reason}), but {who} answers the coordinator: "
                       "nobody is evicted, and the ring is planned again over everyone")]

    def unanswered(self, who: str, why: str) -> list[Action]:
        """`who` did not acknowledge the ping within its bound, or its link is down (`why`)."""
        if (pending := self.pending.pop(who, None)) is None:
            return []
        reporter, reason = pending
        return [Evict(who, reason, f"{reporter}'s report confirmed: {why}")]

    def reset(self) -> None:
        """A new epoch: reports of the last one are stale."""
        self.pending.clear()

"""How often a drift may re-plan the ring, and at which speed a member whose speed swings is planned.

Every re-plan cuts every reply in flight (they resume on the next ring) and may move stages, so it has a cost
that drift.py alone did not weigh: a member alternating between 3× slower and its normal speed every 40 s
(a laptop's thermal throttling, a build starting and stopping) was re-planned 15 times in 600 s, each new
plan already wrong when it was admitted (issue 55, finding 4). Two rules, pure (times in, verdicts out):

- Back-off: after a drift re-plan, the next waits `backoff_s` (BACKOFF_S at first, doubling with each re-plan
  that comes within STEADY_S of the one before, at most MAX_BACKOFF_S); a ring steady for STEADY_S starts over.
- Slowest speed: a member is planned at its slowest speed measured within the last STEADY_S (its stage time
  over its probe's, as the serving ring measured it), so a member that swings is planned for its slow phase
  until it has been steady for STEADY_S (a speed counts once it has held SUSTAINED_S); a drift that this
  speed already answers is held back. An honest one-time slow-down is planned promptly (its slowest speed is
  the one it runs at); a speed-up waits out STEADY_S.

Each verdict carries the line the session's log shows: why a re-plan was held back, or which speed was used.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kafila.session.coordinator.drift import HOLD_S, Drift

# the first back-off is what a drift takes anyway (it holds HOLD_S on the new ring): a ring whose probe
# mispredicted it, planned again at 30 s, still plans for a member that slowed meanwhile as soon as before
BACKOFF_S = HOLD_S
MAX_BACKOFF_S = 1920.0
STEADY_S = 600.0
# A speed counts once it has held this long: the slowest of each such stretch (a bucket of at least half as many
# once-a-second samples) is a speed the member ran at, not a stage median's passing spike (a new ring's first calls)
SUSTAINED_S = 10.0
SAME = 1.1  # speeds within this factor of each other are the same plan (a drift is at least drift.SLOWER away)


@dataclass(frozen=True)
class Verdict:
    """What to do with a drift: re-plan at `speed`, or not now (None); `note` is the session log's line."""

    speed: dict[str, float] | None  # every member's speed to plan with
    note: str | None = None
    quiet_until: float | None = None  # held back: the drift is no news before this


@dataclass
class ReplanBudget:
    """The drift re-plans so far and each member's measured speeds over the last STEADY_S."""

    backoff_s: float = BACKOFF_S
    last_at: float | None = None  # the last drift re-plan
    seen: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)  # member -> (when, speed) measured

    def observe(self, now: float, speeds: dict[str, float]) -> None:
        """Each member's speed as the serving ring measures it now (its plan's speed × measured / predicted)."""
        for name, speed in speeds.items():
            if math.isfinite(speed) and speed > 0:
                kept = self.seen.setdefault(name, deque())
                while kept and now - kept[0][0] >= STEADY_S:  # oldest first: a second's work, not the window's
                    kept.popleft()
                kept.append((now, speed))

    def slowest(self, name: str, now: float) -> float | None:
        """`name`'s slowest speed sustained for SUSTAINED_S within the last STEADY_S (None: none measured)."""
        buckets: dict[int, list[float]] = {}
        for t, s in self.seen.get(name, []):
            if now - t < STEADY_S:
                buckets.setdefault(int(t // SUSTAINED_S), []).append(s)
        return max((min(b) for b in buckets.values() if len(b) >= SUSTAINED_S / 2), default=None)

    def weigh(self, now: float, drift: Drift, planned: dict[str, float], measured: dict[str, float]) -> Verdict:
        """Whether `drift` may re-plan now, and with which speeds: `measured` (drift.measured_speed), each member
        held at its slowest recent speed; `planned`: the speeds the serving ring was planned with."""
        speed, notes = dict(measured), []
        for name in speed:
            slowest = self.slowest(name, now)
            if slowest is not None and slowest > speed[name] * SAME:
                notes.append(f"{name} at {slowest:.2f}× (its slowest in the last {STEADY_S:.0f} s; "
                             f"{speed[name]:.2f}× now)")
                speed[name] = slowest
        used = f"planned at the slowest speeds measured until steady for {STEADY_S:.0f} s: {', '.join(notes)}"
        m = drift.member
        if max(speed[m], planned.get(m, 1.0)) < min(speed[m], planned.get(m, 1.0)) * SAME:
            # a speed-up its slowest recent speed answers: news again once that speed has left the window
            slow_at = max((t for t, s in self.seen.get(m, []) if s > measured[m] * SAME), default=now)
            return Verdict(None, f"{drift.text()}; not planned again: it ran slower within the last {STEADY_S:.0f} s,"
                                 f" and it is already {used}", slow_at + STEADY_S)
        if self.last_at is not None and now < self.last_at + self.backoff_s:
            return Verdict(None, f"{drift.text()}; not planned again yet: drift re-plans wait {self.backoff_s:.0f} s "
                                 f"apart (the last {now - self.last_at:.0f} s ago)", self.last_at + self.backoff_s)
        return Verdict(speed, used if notes else None)

    def planned(self, now: float) -> None:
        """A drift re-planned the ring at `now`: the next one waits longer, unless the ring was steady meanwhile."""
        close = self.last_at is not None and now - self.last_at < STEADY_S
        self.backoff_s = min(self.backoff_s * 2, MAX_BACKOFF_S) if close else BACKOFF_S
        self.last_at = now

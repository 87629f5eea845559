"""When a member's measured stage time has left its prediction long enough to plan the ring again.

The head reports each stage's running median time beside the plan's prediction (`stats`, every second).
A member that stays SLOWER times slower than predicted for HOLD_S (its owner started a build, a laptop
went on battery) is planned again with the measured numbers; one as much faster likewise. No
oscillation: a member planned again is not planned back faster within SETTLE_S unless it runs at
least SPEEDUP times faster than its prediction. Pure: times in, verdicts out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SLOWER = 1.5
HOLD_S = 30.0
SETTLE_S = 300.0
SPEEDUP = 2.0
# A stage's median that has not moved for this long is the last one measured, not news: the ring is idle,
# and an idle ring's old figures must not add up to a drift. Shorter than HOLD_S, so stale figures alone never
# make one; not much shorter: on a busy machine a decoding ring's median was seen to stand still for 12 s.
IDLE_S = 20.0


@dataclass(frozen=True)
class Drift:
    """A member whose stage has run `factor` times its prediction for HOLD_S (factor < 1: faster)."""

    member: str
    predicted_s: float
    measured_s: float

    @property
    def factor(self) -> float:
        return self.measured_s / self.predicted_s

    def text(self) -> str:
        """The reason a person reads."""
        way = f"{self.factor:.1f}× slower" if self.factor > 1 else f"{1 / self.factor:.1f}× faster"
        return (f"{self.member} runs {way} than planned ({self.measured_s * 1e3:.1f} ms a call, "
                f"predicted {self.predicted_s * 1e3:.1f} ms) for {HOLD_S:.0f} s")


@dataclass
class DriftWatch:
    """Each member's drift from its prediction over time; `observe` says when one calls for a new plan."""

    since: dict[str, float] = field(default_factory=dict)  # member → when its drift (one way) began
    way: dict[str, int] = field(default_factory=dict)  # member → +1 slower, -1 faster
    moved_at: dict[str, float] = field(default_factory=dict)  # member → when it was last planned again
    quiet_until: dict[str, float] = field(default_factory=dict)  # member → its drift is not news before this
    quiet_way: dict[str, int | None] = field(default_factory=dict)  # ... that way (None: either)
    last: dict[str, tuple[float, float]] = field(default_factory=dict)  # member → (its median, when it changed)

    def observe(self, now: float, stages: dict[str, tuple[float, float | None]]) -> Drift | None:
        """Stage times {member: (predicted_s, measured_s|None)} at `now`; the drift to plan again for, if any."""
        found: list[Drift] = []
        for name, (predicted, measured) in stages.items():
            if measured is not None and self.last.get(name, (None, 0.0))[0] != measured:
                self.last[name] = (measured, now)
            idle = now - self.last.get(name, (None, now))[1] >= IDLE_S
            way = 0 if idle else self._way(name, now, predicted, measured)
            if way == 0:
                self.since.pop(name, None)
                self.way.pop(name, None)
                continue
            if self.way.get(name) != way:
                self.since[name], self.way[name] = now, way
            # dismissed: no news that way until then (a drift the other way is); it may go on holding meanwhile
            quiet = now < self.quiet_until.get(name, now) and self.quiet_way.get(name) in (None, way)
            if not quiet and now - self.since[name] >= HOLD_S:
                assert measured is not None
                found.append(Drift(name, predicted, measured))
        if not found:
            return None
        return max(found, key=lambda d: max(d.factor, 1 / d.factor))  # the farthest from its plan first

    def _way(self, name: str, now: float, predicted: float, measured: float | None) -> int:
        if measured is None or predicted <= 0:
            return 0
        ratio = measured / predicted
        if ratio >= SLOWER:
            return 1
        recently = now - self.moved_at.get(name, -SETTLE_S) < SETTLE_S
        if ratio <= 1 / (SPEEDUP if recently else SLOWER):
            return -1
        return 0

    def dismiss(self, member: str, now: float, until: float | None = None) -> None:
        """`member`'s drift was weighed and not planned for: no news that way for SETTLE_S (or until `until`)."""
        self.quiet_until[member] = now + SETTLE_S if until is None else until
        self.quiet_way[member] = self.way.get(member)  # None: either way

    def planned_again(self, member: str, now: float) -> None:
        """A new plan takes `member`'s drift in: its predictions change, so every watch starts over."""
        self.moved_at[member] = now
        self.since.clear()
        self.way.clear()


def measured_speed(speed: dict[str, float], stages: dict[str, tuple[float, float | None]],
                   drift: Drift) -> dict[str, float]:
    """Each member's time over its probe's as the serving ring measures it: `speed` (the factors planned so far)
    times the drifting member's drift, and times each other stage's running median over its prediction
    {member: (predicted_s, measured_s|None)}, however far off.

    A new plan takes all the ring measured: a member left at its old speed because it had not drifted for
    HOLD_S yet (cy 4x slower, its stage's median well past SLOWER, while another member's drift was planned
    for first) needed a second new plan 30 s later; and a machine loaded as a whole slows every stage alike,
    so a plan that took only the drifting one at its measured speed moved its blocks onto members as slow
    (4 members at 6x their plan beside a job loading both cores were planned again one by one)."""
    out = dict(speed)
    for name, (predicted, measured) in stages.items():
        if name != drift.member and measured is not None and predicted > 0:
            out[name] = out.get(name, 1.0) * measured / predicted
    out[drift.member] = out.get(drift.member, 1.0) * drift.factor
    return out

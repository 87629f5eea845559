"""EMULATION: a member's slow-down changing while it serves (`kafila join --throttle-schedule 0:1,60:4`).

A laptop whose owner starts a build, or that goes on battery, gets slower in the middle of a session; the
schedule emulates that on one machine, as `--throttle` emulates a slower machine. Its clock starts when
the member first serves (admitted), so that a schedule means the same however long joining took.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from kafila.errors import SessionError


def parse_schedule(text: str) -> tuple[tuple[float, float], ...]:
    """'0:1,60:4' → ((0, 1), (60, 4)): from each second on (since first serving), that slow-down (>= 1)."""
    steps: list[tuple[float, float]] = []
    for part in text.replace(" ", "").split(","):
        at, _, factor = part.partition(":")
        try:
            steps.append((float(at), float(factor)))
        except ValueError:
            raise SessionError(f"--throttle-schedule takes SECONDS:FACTOR pairs such as 0:1,60:4, got {part!r}") \
                from None
    increasing = all(b[0] > a[0] for a, b in itertools.pairwise(steps)) and math.isfinite(steps[-1][0])
    if steps[0][0] != 0 or not increasing:
        raise SessionError(f"--throttle-schedule {text}: the seconds must start at 0 and increase")
    if any(not (math.isfinite(f) and f >= 1) for _, f in steps):
        raise SessionError(f"--throttle-schedule {text}: every factor must be at least 1 (a slower machine)")
    return tuple(steps)


@dataclass
class Throttle:
    """The member's slow-down now: its schedule's step since it first served (the first step before)."""

    steps: tuple[tuple[float, float], ...] = ((0.0, 1.0),)
    started: float | None = None

    def start(self) -> None:
        """The member serves: the schedule's clock starts (once)."""
        if self.started is None:
            self.started = time.monotonic()

    def __call__(self) -> float:
        elapsed = 0.0 if self.started is None else time.monotonic() - self.started
        return [f for at, f in self.steps if at <= elapsed][-1]

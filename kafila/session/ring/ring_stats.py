"""The head's running figures of the ring: measured stage times, the network's share of a token, tokens/s, TTFT.

They go to the host as a `stats` message and into every finished request's `done` event.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from kafila.session.protocol import messages
from kafila.session.state import SessionState

# The running figures are medians of the last STATS_WINDOW decode calls: a shared machine's stray slow
# call moved a running average by a fifth (the prediction is the probe's median too), and a window this
# long is still what the ring does now.
STATS_WINDOW = 32


@dataclass
class RingStats:
    """Running medians of measured stage time per member and of the network's share of a token."""

    predicted: dict[str, float]
    times: dict[str, deque[float]] = field(default_factory=dict)
    shares: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))  # a circuit's s outside compute
    # the head's own s between a decode frame's return (its stage done) and the next one's send: sampling,
    # streaming the token, forming the next frame; timed only with the ring otherwise empty (one stream)
    turnarounds: deque[float] = field(default_factory=lambda: deque(maxlen=STATS_WINDOW))
    tokens: int = 0
    window_start: float = field(default_factory=time.perf_counter)
    tokens_per_s: float | None = None
    ttft: messages.TtftTime | None = None  # the latest request's time to first token, beside the plan's

    def add(self, names: list[str], times_ns: tuple[int, ...], round_trip_ns: int, steps: int = 1) -> None:
        """One decode frame's figures: each stage's compute time, the whole circuit's; `steps`: the frame's
        compute steps (a verification's drafted rows are calls of their own), so a stage's time per step."""
        for name, t in zip(names, times_ns, strict=False):
            self.times.setdefault(name, deque(maxlen=STATS_WINDOW)).append(t / steps / 1e9)
        if round_trip_ns > 0:
            gap = max(round_trip_ns - sum(times_ns), 0)
            self.shares.append(gap / round_trip_ns)
            self.gaps.append(gap / 1e9)

    def turnaround(self, ns: int) -> None:
        """The head's time from a decode frame's return to the next frame's send, the ring otherwise empty."""
        self.turnarounds.append(ns / 1e9)

    def circuit_costs(self) -> tuple[float, float] | None:
        """(median seconds of a circuit outside compute, seconds of one compute step round the ring); None
        before a decode frame came back."""
        gap = self.circuit_gap_s
        return None if gap is None else (gap, sum(self.measured.values()))

    @property
    def measured(self) -> dict[str, float]:
        return {name: statistics.median(t) for name, t in self.times.items()}

    @property
    def circuit_gap_s(self) -> float | None:
        """A decode circuit's median seconds outside compute: the links, each hop's software and the head's
        turnaround (None before a decode frame came back)."""
        if not self.gaps:
            return None
        return statistics.median(self.gaps) + (statistics.median(self.turnarounds) if self.turnarounds else 0.0)

    @property
    def network_share(self) -> float | None:
        return statistics.median(self.shares) if self.shares else None

    def count_token(self) -> None:
        self.tokens += 1
        elapsed = time.perf_counter() - self.window_start
        if elapsed >= 1.0:
            self.tokens_per_s = self.tokens / elapsed
            self.tokens, self.window_start = 0, time.perf_counter()

    def as_dict(self) -> dict[str, Any]:
        measured = self.measured
        return {
            "stages": {n: {"predicted_s": p, "measured_s": measured.get(n)} for n, p in self.predicted.items()},
            "network_share": self.network_share,
            "tokens_per_s": self.tokens_per_s,
            "ttft": None if self.ttft is None else asdict(self.ttft),
        }

    def message(self) -> messages.Stats:
        """The `stats` message the head sends the host."""
        measured = self.measured
        return messages.Stats({n: messages.StageTime(p, measured.get(n)) for n, p in self.predicted.items()},
                              self.network_share, self.tokens_per_s, self.ttft, self.circuit_gap_s)


def show_stats(state: SessionState, stats: messages.Stats) -> None:
    """The head's figures (its `stats` message) on a session's state for the dashboard: each planned stage's
    measured time, the network's share, tokens/s and the latest TTFT; listeners are told."""
    for name, s in stats.stages.items():
        if name in state.stages:
            state.stages[name].measured_s = s.measured_s
    state.network_share, state.tokens_per_s = stats.network_share, stats.tokens_per_s
    state.circuit_gap_s = stats.circuit_gap_s
    state.ttft = None if stats.ttft is None else asdict(stats.ttft)
    state.changed()

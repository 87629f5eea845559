"""Speculation at the head: each request drafts by prompt lookup, and each step's draft length comes from
the ring's measured costs and the acceptance seen so far (planner/speculation.py).

Modes (`--speculate`): `off`; `lookup`, which drafts whenever the lookup finds a match (at least one
token); `auto` (the default), which drafts only when the expected tokens per second beat a plain step,
so on a ring whose circuits cost little beside its compute it stays off. Acceptance is counted per
match length over the session (recent drafts weigh more), since a one-token match is a weaker guess
than a three-token one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kafila.engine.lookup import LONGEST, Lookup
from kafila.planner.speculation import best_draft
from kafila.session.protocol.fields import SPECULATION_MODES as MODES

DECAY = 0.98  # each verification's weight against the ones before: about the last 50 count


@dataclass
class Acceptance:
    """Accepted and tried drafted tokens, decayed: alpha, from a prior of one of each."""

    accepted: float = 1.0
    tried: float = 2.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.tried

    def add(self, drafted: int, kept: int) -> None:
        # a verification tried the drafted tokens up to and including the first rejected one
        self.accepted = self.accepted * DECAY + kept
        self.tried = self.tried * DECAY + kept + (kept < drafted)


@dataclass
class Speculator:
    """The head's speculation: its mode, the acceptance per match length, and the ring's costs.

    `costs` returns (seconds of a circuit outside compute, seconds of one compute step round the ring),
    or None before the ring has measured a decode step; `others` how many other requests share frames.
    """

    mode: str
    costs: Callable[[], tuple[float, float] | None]
    others: Callable[[], int] = lambda: 0
    acceptance: dict[int, Acceptance] = field(default_factory=lambda: {n: Acceptance() for n in
                                                                        range(1, LONGEST + 1)})
    drafted: int = 0
    accepted: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def drafter(self, mode: str | None = None) -> RequestDrafter | None:
        """A new request's drafter in `mode` (None: the session's), or None when speculation is off."""
        mode = mode or self.mode
        return None if mode == "off" else RequestDrafter(self, mode)

    def length(self, n: int, candidates: int, mode: str) -> int:
        """How many of `candidates` tokens, drafted from an n-token match, the next step should carry."""
        costs = self.costs()
        if costs is None:
            return 0
        network_s, step_s = costs
        return best_draft(self.acceptance[n].alpha, candidates, network_s, step_s, self.others(),
                          at_least=1 if mode == "lookup" else 0)

    def as_dict(self) -> dict[str, object]:
        """The session's speculation figures (the `done` event, `demo --json`)."""
        return {"mode": self.mode, "drafted": self.drafted, "accepted": self.accepted}


@dataclass
class RequestDrafter:
    """One request's lookup index, drafting as its Speculator decides."""

    speculator: Speculator
    mode: str
    lookup: Lookup = field(default_factory=Lookup)
    drafted: int = 0  # this request's drafted tokens, and how many of them were kept
    accepted: int = 0
    _n: int = 0  # the match length of the last draft

    def draft(self, tokens: Sequence[int], limit: int) -> list[int]:
        match = self.lookup.match(tokens, limit)
        if match is None or not match.tokens:
            return []
        self._n = match.n
        return match.tokens[: self.speculator.length(match.n, len(match.tokens), self.mode)]

    def verified(self, drafted: int, accepted: int) -> None:
        s = self.speculator
        s.acceptance[self._n].add(drafted, accepted)
        for counts in (self, s):
            counts.drafted += drafted
            counts.accepted += accepted

"""The records control messages carry inside them (kafila.session.protocol.messages decodes them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EdgeOutcome:
    """A member's outgoing ring edge: predicted against what verification found."""

    predicted: str
    actual: str  # "direct", "relay" or "failed"
    ready_ms: float | None
    error: str | None
    rtt_ms: float | None = None  # its round trip as QUIC measured it (emulated link delays included)


@dataclass(frozen=True)
class StageTime:
    """One stage's predicted and measured compute time per call, in seconds."""

    predicted_s: float
    measured_s: float | None


@dataclass(frozen=True)
class TtftTime:
    """The latest request's time to first token against the plan's prediction for its prompt."""

    prompt_tokens: int  # the tokens it prefilled (those a reused cache held are not counted)
    measured_s: float  # from its arrival at the head to its first token
    predicted_s: float | None  # the plan's TTFT for as many tokens (None: the plan predicts none)


@dataclass(frozen=True)
class Measured:
    """One member as the planner saw it: its measurements (kafila.planner.Member's numbers)."""

    bw: float
    disp: float
    mem: int
    ubw: float
    nat: str
    rtt_ms: float | None

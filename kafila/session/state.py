"""The session-state model: what a session knows, updated by the session code, rendered by the TUI/CLI.

Plain dataclasses, no Textual or network imports ("attributes down, messages up"): the session
code mutates a SessionState through its methods, each of which notifies listeners; the TUI
subscribes and re-renders. `to_json()`/`from_json()` let tests record a real run and replay it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotation only: the state model imports no network code at run time
    from kafila.net.trust import VerifiedMember

from kafila.session.phases import PHASES, IllegalTransition, illegal, strict_from_env

log = logging.getLogger("kafila.session")
EDGE_STATES = ("pending", "direct", "relayed", "failed")


@dataclass
class MemberView:
    """One member as the session sees it."""

    name: str
    role: str = "member"  # "host" (coordinator only) or "member"
    status: str = "joined"  # measuring, measured, joined, ready, loading, serving, lost, refused
    bandwidth_bytes_per_s: float | None = None
    dispatch_s: float | None = None
    memory_bytes: int | None = None
    rtt_ms: float | None = None
    nat: str | None = None
    nat_evidence: dict[str, Any] = field(default_factory=dict)
    # {"throttle": 4, "memory_gb": 2, "link_mbit": [40, 160]}: emulation only
    emulated: dict[str, float | list[float]] = field(default_factory=dict)
    probe_samples: list[float] = field(default_factory=list)  # bytes/s of each probe call, for a sparkline
    # prefill per call of `prow` rows: pdisp + n·pblk + bytes/pbw (empty: not measured); the machine's short id
    prefill: dict[str, float] = field(default_factory=dict)
    expert_rates: dict[str, float] = field(default_factory=dict)  # routed experts' prefill bytes/s per weight type
    machine: str = ""
    build: str = ""
    note: str = ""  # why refused or lost; how its measurement goes (its step, so far)


def expert_rates(measurements: dict[str, Any]) -> dict[str, float]:
    """The announcement's routed-expert prefill rates per weight type, those that are positive numbers."""
    rates = measurements.get("pebw")
    if not isinstance(rates, dict):
        return {}
    return {str(k): float(v) for k, v in rates.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf")}


def member_view(vm: VerifiedMember) -> MemberView:
    """What the dashboard shows of a verified member's announcement."""
    m = vm.measurements
    return MemberView(
        name=vm.name, role=str(m.get("role", "member")), status="joined",
        bandwidth_bytes_per_s=m.get("bw"), dispatch_s=m.get("disp"), memory_bytes=m.get("mem"),
        rtt_ms=vm.rtt_ms, nat=vm.nat_class.value,
        nat_evidence={"mapped": vm.mapped, "local": vm.local, "observed": vm.observed},
        emulated=dict(m.get("emu") or {}), probe_samples=list(m.get("samples") or []), build=str(m.get("build", "")),
        prefill={k: m[k] for k in ("pbw", "pdisp", "pblk", "prow") if isinstance(m.get(k), int | float)},
        expert_rates=expert_rates(m),
        machine=str(m.get("mach", "")),
    )


@dataclass
class EdgeView:
    """A ring edge: predicted reachability against what verification found."""

    a: str
    b: str
    predicted: str  # "direct" | "relay"
    state: str = "pending"  # one of EDGE_STATES
    ready_ms: float | None = None
    rtt_ms: float | None = None  # measured once verified (QUIC's estimate)

    @property
    def wrong(self) -> bool:
        """The prediction disagreed with what was verified."""
        return (self.state == "direct" and self.predicted == "relay") or (
            self.state == "relayed" and self.predicted == "direct"
        )


@dataclass
class StageStats:
    """Predicted against measured compute time of one member's stage, and the network share."""

    predicted_s: float
    measured_s: float | None = None
    calls: int = 0


@dataclass
class SessionState:
    """Everything the dashboard shows about one session."""

    role: str = "member"  # this process's role: host, member
    me: str = ""
    code: str | None = None
    phase: str = "starting"
    model: str = ""
    members: dict[str, MemberView] = field(default_factory=dict)
    predicted: dict[str, dict[str, str]] = field(default_factory=dict)  # predicted[a][b] = direct|relay
    edges: list[EdgeView] = field(default_factory=list)
    plan: dict[str, Any] | None = None  # the planner's JSON (issue 3 schema, baselines included)
    builds: dict[str, Any] | None = None  # {"mode": "exact"|"mixed", "differ": {member: [what differs]}, ...}
    rejection: str | None = None
    delivery: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (bytes done, total)
    stages: dict[str, StageStats] = field(default_factory=dict)
    network_share: float | None = None  # fraction of a token's ring time spent outside compute
    # a decode circuit's median time outside compute as the head measures it: the links' one-way delays, each
    # hop's software (QUIC, the event loops, handing rows to llama.cpp) and the head's turnaround (sampling,
    # streaming the token), which the links' RTTs leave out
    circuit_gap_s: float | None = None
    tokens_per_s: float | None = None
    # the latest request's time to first token: {prompt_tokens, measured_s, predicted_s|null} (predicted: the
    # plan's for as many prompt tokens)
    ttft: dict[str, Any] | None = None
    api_url: str | None = None
    lost: str | None = None  # which member was lost, and what happened (or why the session cannot go on)
    coordinator: str | None = None  # who coordinates the session: the host, or the head once the host left
    coordinator_left: str | None = None  # the host left the session: when and why, for a person
    rendezvous_unreachable: str | None = None  # why the rendezvous is unreachable (None: reachable, or not yet asked)
    # each time the ring was planned again because a member ran slower or faster than planned: member,
    # predicted_s, measured_s (its stage's call), was_bottleneck_s, bottleneck_s (the new plan's), slower (each
    # member whose speed the new plan changed → its measured time over the old plan's prediction)
    replans: list[dict[str, Any]] = field(default_factory=list)
    # member → the share of the model copied to its disk so far (1.0: held and verified), so that the ring
    # outlives a host no other member holds the model for (delivery.model_copy_sender)
    copies: dict[str, float] = field(default_factory=dict)
    events: list[tuple[float, str]] = field(default_factory=list)
    # an illegal phase change raises (tests) or is logged (production): phases.py
    _strict: bool = field(default_factory=strict_from_env, repr=False, compare=False)
    _listeners: list[Callable[[SessionState], None]] = field(default_factory=list, repr=False, compare=False)

    # -- updates (each notifies) --------------------------------------------------------------
    def subscribe(self, listener: Callable[[SessionState], None]) -> None:
        self._listeners.append(listener)

    def changed(self) -> None:
        for listener in list(self._listeners):
            listener(self)

    def log(self, text: str) -> None:
        """Add a line to the session's event log."""
        self.events.append((time.time(), text))
        self.changed()

    def set_phase(self, phase: str, text: str | None = None) -> None:
        """The one way the phase changes: checked against phases.TRANSITIONS."""
        why = illegal(self.phase, phase)
        if why is not None:
            if self._strict or phase not in PHASES:
                raise IllegalTransition(why)
            log.warning("%s (now %s: %s)", why, phase, text)
        self.phase = phase
        if text:
            self.events.append((time.time(), text))
        self.changed()

    def set_rendezvous(self, unreachable: str | None) -> None:
        """The rendezvous was lost (why, for a person), or answers again (None); logged either way."""
        self.rendezvous_unreachable = unreachable
        self.log(unreachable or "the rendezvous answers again: re-registering with it")

    def upsert_member(self, view: MemberView) -> None:
        self.members[view.name] = view
        self.changed()

    def update_member(self, name: str, **changes: Any) -> None:
        view = self.members.setdefault(name, MemberView(name))
        for key, value in changes.items():
            setattr(view, key, value)
        self.changed()

    def set_edge(self, a: str, b: str, state: str, ready_ms: float | None = None, rtt_ms: float | None = None) -> None:
        assert state in EDGE_STATES, state
        for e in self.edges:
            if (e.a, e.b) == (a, b):
                e.state, e.ready_ms, e.rtt_ms = state, ready_ms, rtt_ms
        self.changed()

    def token_time(self) -> dict[str, Any] | None:
        """One token's time round the ring as the plan predicts it: its stages' times plus the edges' share.

        The edges' share is the serving ring's measured time outside compute once its head has reported one
        (`edges_from` "circuits"); before that, half of each edge's QUIC round trip ("quic"), which counts
        the links but not each hop's software (on loopback that is most of it). None before a plan, or with
        neither measured.
        """
        stages = (self.plan or {}).get("stage_seconds")
        if not stages:
            return None
        compute = sum(float(t) for t in stages.values())
        quic = None if any(e.rtt_ms is None for e in self.edges) else sum(e.rtt_ms or 0.0 for e in self.edges) / 2e3
        edges, source = (self.circuit_gap_s, "circuits") if self.circuit_gap_s is not None else (quic, "quic")
        if edges is None:
            return None
        return {"stages_s": compute, "edges_s": edges, "edges_from": source, "edges_quic_s": quic,
                "predicted_s": compute + edges}

    # -- recording ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        # field by field: asdict() would deep-copy the listeners (consoles, locks) too
        d = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        d["members"] = {k: asdict(v) for k, v in self.members.items()}
        d["edges"] = [asdict(e) for e in self.edges]
        d["stages"] = {k: asdict(v) for k, v in self.stages.items()}
        d["delivery"] = {k: list(v) for k, v in self.delivery.items()}
        d["events"] = [list(e) for e in self.events]
        return json.loads(json.dumps(d, default=str))  # a deep, JSON-safe copy

    def public_json(self) -> dict[str, Any]:
        """`to_json()` for whoever asks over HTTP: no join code, and its secret scrubbed from every text.

        The code admits anyone to the session; a dashboard elsewhere does not need it, and the
        process that does (the TUI beside the host) holds this object itself (DESIGN §5).
        """
        d = self.to_json()
        d["code"] = None
        pattern = _code_pattern(self.code) if self.code else None
        return _scrub(d, pattern) if pattern is not None else d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SessionState:
        d = dict(d)
        d["members"] = {k: MemberView(**v) for k, v in d.get("members", {}).items()}
        d["edges"] = [EdgeView(**e) for e in d.get("edges", [])]
        d["stages"] = {k: StageStats(**v) for k, v in d.get("stages", {}).items()}
        d["delivery"] = {k: tuple(v) for k, v in d.get("delivery", {}).items()}
        d["events"] = [tuple(e) for e in d.get("events", [])]
        return cls(**d)


# How a person may write the join code's secret (as JoinCode.parse forgives it): any case, separators
# between characters, and the letters i, l, o for the digits 1, 1, 0.
_SEPARATORS = r"[\s\-_]*"
_FORGIVEN = {"1": "1il", "0": "0o"}
_AS_DIGITS = str.maketrans({"i": "1", "l": "1", "o": "0"})
SECRET_CHARS = 16
REDACTED = "[join code withheld]"


def _code_pattern(code: str) -> re.Pattern[str] | None:
    """A pattern matching the code's secret however it is written (None when there is nothing to hide)."""
    chars = re.sub(r"[\s\-_]", "", code.strip().lower()).translate(_AS_DIGITS)
    if not chars:
        return None
    # the whole code as written (its session id is not secret, but a text with both is the code) ...
    forms = [re.escape(code.strip())]
    if len(chars) > SECRET_CHARS:  # ... and its secret in any form (a malformed code has none to find)
        forms.append(_SEPARATORS.join(f"[{re.escape(_FORGIVEN.get(c, c))}]" for c in chars[-SECRET_CHARS:]))
    return re.compile("|".join(forms), re.IGNORECASE)


def _scrub(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, list):
        return [_scrub(v, pattern) for v in value]
    if isinstance(value, dict):
        return {_scrub(k, pattern): _scrub(v, pattern) for k, v in value.items()}
    return value

"""The host's check of a member's llama.cpp build and wire protocol: exact, mixed by consent, or refused.

A ring whose members share one build gives the numbers one context would (exact). Members whose
builds differ round differently, so the ring is no longer bit-exact: the host refuses them unless
the session was opened with --mixed-builds. The wire protocol must match in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafila.session.protocol.announcement import wire_protocol

EXACT, MIXED = "exact", "mixed"


def build_differences(mine: str, theirs: str) -> list[str]:
    """What differs between two build tags, for a refusal message."""
    names = ("llama-cpp-python version", "llama.cpp libraries", "compiled CPU features")
    a, b = mine.split("/"), theirs.split("/")
    if len(a) != 3 or len(b) != 3:
        return [f"build {theirs!r} is not comparable with {mine!r}"]
    return [f"{n}: {y} there, {x} here" for n, x, y in zip(names, a, b, strict=True) if x != y]


@dataclass(frozen=True)
class BuildVerdict:
    """Whether a member may take part, and how its build compares with the host's."""

    admitted: bool
    differences: tuple[str, ...] = ()  # what differs from the host's build (empty: same build)
    reason: str = ""  # why refused, one line

    @property
    def exact(self) -> bool:
        return self.admitted and not self.differences


def judge_member(host_build: str, announced: Mapping[str, Any], mixed_builds: bool) -> BuildVerdict:
    """The verdict on a member's announcement (its "build" and "proto" fields) against the host's build."""
    proto = announced.get("proto")
    if proto != wire_protocol():
        spoken = f"speaks {proto!r}" if proto else "announced no wire protocol version"
        return BuildVerdict(False, reason=f"it {spoken}, the host speaks {wire_protocol()!r} (a different Kafila)")
    diffs = tuple(build_differences(host_build, str(announced.get("build", ""))))
    if diffs and not mixed_builds:
        return BuildVerdict(False, diffs, "its llama.cpp build differs from the host's (" + "; ".join(diffs)
                            + "); the host admits it only with --mixed-builds (the ring is then not bit-exact)")
    return BuildVerdict(True, diffs)


@dataclass
class RingBuilds:
    """Exact or mixed, and which members differ from the host's build: for the plan, state and JSON."""

    host: str
    differ: dict[str, list[str]] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return MIXED if self.differ else EXACT

    def add(self, name: str, verdict: BuildVerdict) -> None:
        if verdict.differences:
            self.differ[name] = list(verdict.differences)
        else:
            self.differ.pop(name, None)

    def for_members(self, names: list[str]) -> dict[str, Any]:
        """The JSON view over the members now in the ring."""
        differ = {n: d for n, d in self.differ.items() if n in names}
        return {"mode": MIXED if differ else EXACT, "host": self.host, "bit_exact": not differ, "differ": differ}

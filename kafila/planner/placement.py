"""A placement (one split of the model over one ring order) and its derived numbers; the JSON form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafila.planner.cost import Ctx, edge_cost_ns
from kafila.planner.order import cycle_edges
from kafila.planner.reachability import predict_edge
from kafila.planner.spec import Member


@dataclass(frozen=True)
class Edge:
    """One ring edge, in the direction activations flow."""

    a: str
    b: str
    predicted: str  # "direct" | "relay"
    cost_ms: float

    def to_json(self) -> dict[str, Any]:
        """JSON form: {a, b, predicted, cost_ms}."""
        return {"a": self.a, "b": self.b, "predicted": self.predicted, "cost_ms": self.cost_ms}


@dataclass(frozen=True)
class Placement:
    """Order (head first), ranges per member name, and what they cost. Infeasible ones say why."""

    strategy: str  # "kafila" | "uniform" | "memory"
    feasible: bool
    reason: str | None
    order: tuple[str, ...]
    head: str | None
    ranges: dict[str, tuple[int, int]]
    stage_seconds: dict[str, float]
    bottleneck_seconds: float | None
    circuit_seconds: float | None
    utilisation: float | None
    edges: tuple[Edge, ...]
    memory_bytes: dict[str, int]
    # {"prompt_tokens": P, "seconds": predicted TTFT, "model": kafila.planner.ttft.TtftModel's JSON}; None: the
    # members measured no prefill (or the placement is infeasible)
    ttft: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The stable JSON fields of the issue, in its order."""
        return {
            "feasible": self.feasible,
            "reason": self.reason,
            "order": list(self.order),
            "head": self.head,
            "ranges": {n: list(r) for n, r in self.ranges.items()},
            "stage_seconds": dict(self.stage_seconds),
            "bottleneck_seconds": self.bottleneck_seconds,
            "circuit_seconds": self.circuit_seconds,
            "utilisation": self.utilisation,
            "edges": [e.to_json() for e in self.edges],
            "memory_bytes": dict(self.memory_bytes),
            "ttft": self.ttft,
        }


def ring_edges(members: Sequence[Member], order: Sequence[int]) -> tuple[Edge, ...]:
    """The m cyclic edges of the order (for m = 2 the one pair twice, once per direction)."""
    return tuple(
        Edge(
            a=members[x].name,
            b=members[y].name,
            predicted=predict_edge(members[x].nat, members[y].nat),
            cost_ms=edge_cost_ns(members[x], members[y]) / 1e6,
        )
        for x, y in cycle_edges(order)
    )


def describe(
    strategy: str,
    ctx: Ctx,
    members: Sequence[Member],
    order: Sequence[int],
    ranges: Sequence[tuple[int, int]],
    reason: str | None = None,
) -> Placement:
    """Evaluate ranges (per member of `order`, head first) with the cost model; memory overruns make it infeasible."""
    stage: dict[str, float] = {}
    memory: dict[str, int] = {}
    over: list[str] = []
    for n, (i, (a, e)) in enumerate(zip(order, ranges, strict=True)):
        name, head = members[i].name, n == 0
        stage[name] = ctx.time(i, a, e, head)
        memory[name] = ctx.need(a, e, head)
        if not ctx.allowed(a, e):
            over.append(f"{name}'s blocks [{a}, {e}) hold no sliding-window layer, which every stage needs")
        elif memory[name] > ctx.M[i]:
            over.append(
                f"{name} would need {gb(memory[name])} for blocks [{a}, {e})"
                f"{' and the head' if head else ''} but has {gb(ctx.M[i])}"
            )
    if over and reason is None:
        reason = ("does not fit in memory: " if all("would need" in o for o in over) else "invalid: ") + "; ".join(over)
    edges = ring_edges(members, order)
    bottleneck = max(stage.values())
    total = sum(stage.values())
    return Placement(
        strategy=strategy,
        feasible=reason is None,
        reason=reason,
        order=tuple(members[i].name for i in order),
        head=members[order[0]].name,
        ranges={members[i].name: r for i, r in zip(order, ranges, strict=True)},
        stage_seconds=stage,
        bottleneck_seconds=bottleneck,
        # One token's trip: every stage once, every edge once one way (half its round-trip cost).
        circuit_seconds=total + sum(e.cost_ms for e in edges) / 2 / 1000,
        utilisation=total / (len(order) * bottleneck),
        edges=edges,
        memory_bytes=memory,
    )


def unplaced(strategy: str, members: Sequence[Member], order: Sequence[int], reason: str) -> Placement:
    """A placement that could not be made at all: no head, no ranges, the reason."""
    return Placement(
        strategy=strategy,
        feasible=False,
        reason=reason,
        order=tuple(members[i].name for i in order),
        head=None,
        ranges={},
        stage_seconds={},
        bottleneck_seconds=None,
        circuit_seconds=None,
        utilisation=None,
        edges=ring_edges(members, order),
        memory_bytes={},
    )


def gb(nbytes: float) -> str:
    """Bytes as decimal gigabytes for messages."""
    return f"{nbytes / 1e9:.2f} GB"

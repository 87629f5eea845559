"""The top level: `make_plan(members, model, workload)` → Plan (order, head, ranges, baselines, admission)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafila.planner import baselines
from kafila.planner.admission import Admission, analyse
from kafila.planner.cost import edge_cost_ns, make_ctx
from kafila.planner.order import EXACT_LIMIT, Cycle, cost_tiers, heuristic_cycle, ring_cost
from kafila.planner.partition import OrderSet, Solution, fits, solve
from kafila.planner.placement import Placement, describe, unplaced
from kafila.planner.spec import Member, ModelSpec, Workload, check_inputs
from kafila.planner.ttft import with_ttft

STRATEGIES = ("kafila", "uniform", "memory")


@dataclass(frozen=True)
class Plan:
    """Kafila's placement, the two baselines on the same ring, and, when rejected, the admission analysis."""

    kafila: Placement
    baselines: dict[str, Placement]  # "uniform", "memory"
    admission: Admission | None
    model: str
    workload: Workload
    ring_cost_ms: float  # Σ predicted edge costs of the chosen order
    exact_order: bool  # False when the ring was too large for exhaustive order search

    @property
    def feasible(self) -> bool:
        """True when the session can be admitted."""
        return self.kafila.feasible

    @property
    def order(self) -> tuple[str, ...]:
        """Member names in ring order, head first."""
        return self.kafila.order

    @property
    def head(self) -> str | None:
        """The head's name (None when rejected)."""
        return self.kafila.head

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """Half-open block range per member name."""
        return self.kafila.ranges

    def placement(self, strategy: str = "kafila") -> Placement:
        """The placement of one strategy: "kafila", "uniform" or "memory"."""
        return self.kafila if strategy == "kafila" else self.baselines[strategy]

    def to_json(self, strategy: str = "kafila") -> dict[str, Any]:
        """The stable JSON schema of issue 3, for the given strategy's placement, with both baselines."""
        out = self.placement(strategy).to_json()
        out["baselines"] = {name: p.to_json() for name, p in self.baselines.items()}
        return out


def _reverse(cycle: Cycle) -> Cycle:
    return (cycle[0], *reversed(cycle[1:]))


def make_plan(members: Sequence[Member], model: ModelSpec, workload: Workload | None = None) -> Plan:
    """Plan the ring: cheapest order, lowest-bottleneck head and partition, baselines; reject with reasons."""
    workload = workload or Workload()
    check_inputs(tuple(members), model, workload)
    ms = tuple(sorted(members, key=lambda mem: mem.name))  # index order = name order, for tie-breaks
    m = len(ms)
    ctx = make_ctx(ms, model, workload)
    cost = [[edge_cost_ns(a, b) for b in ms] for a in ms]

    solution: Solution | None = None
    if m <= EXACT_LIMIT:
        tiers = cost_tiers(cost)
        n_cycles = sum(len(cycles) for _, cycles in tiers)
        every = OrderSet()
        admission_orders = every
        fallback = tiers[0][1][0]
        if fits(ctx, every):
            # Cheapest tier first; a later tier only matters when no cheaper order fits in memory.
            for _, cycles in tiers:
                allowed = every if len(cycles) == n_cycles else OrderSet(tuple(cycles))
                solution = solve(ctx, allowed)
                if solution is not None:
                    break
    else:
        cycle = heuristic_cycle(cost)
        admission_orders = OrderSet((cycle, _reverse(cycle)))
        fallback = cycle
        solution = solve(ctx, admission_orders)

    admission = None
    if solution is None:
        admission = analyse(ms, model, workload, admission_orders)
        order: tuple[int, ...] = fallback
        kafila = unplaced("kafila", ms, order, admission.text)
    else:
        order = solution.order
        kafila = describe("kafila", ctx, ms, order, solution.ranges)
    by_name = {mem.name: mem for mem in ms}
    return Plan(
        kafila=with_ttft(kafila, by_name, model, workload),
        baselines={
            "uniform": with_ttft(baselines.uniform(ctx, ms, order), by_name, model, workload),
            "memory": with_ttft(baselines.memory_proportional(ctx, ms, order), by_name, model, workload),
        },
        admission=admission,
        model=model.name,
        workload=workload,
        ring_cost_ms=ring_cost(order, cost) / 1e6,
        exact_order=m <= EXACT_LIMIT,
    )

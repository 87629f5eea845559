"""Brute force for the planner's property tests: every order × head × contiguous partition."""

from __future__ import annotations

from itertools import combinations, permutations

from kafila.planner.cost import Ctx, edge_cost_ns
from kafila.planner.order import ring_cost
from kafila.planner.reachability import DIRECT, NatClass, predict_edge
from kafila.planner.spec import Member


def chain_best(ctx: Ctx, chain: tuple[int, ...]) -> float | None:
    """Lowest bottleneck over every partition of the chain (head last) that fits in memory."""
    m, k = len(chain), ctx.k
    best = None
    for cuts in combinations(range(1, k), m - 1):
        bounds = (0, *cuts, k)
        worst = 0.0
        for p, i in enumerate(chain):
            a, e, head = bounds[p], bounds[p + 1], p == m - 1
            if ctx.need(a, e, head) > ctx.M[i]:
                break
            worst = max(worst, ctx.time(i, a, e, head))
        else:
            if best is None or worst < best:
                best = worst
    return best


def best_plan(ctx: Ctx, members: tuple[Member, ...]) -> tuple[int, float] | None:
    """(ring cost, bottleneck) minimised lexicographically over orders that fit; None if none fits."""
    m = len(members)
    cost = [[edge_cost_ns(a, b) for b in members] for a in members]
    best: tuple[int, float] | None = None
    for perm in permutations(range(m)):  # perm = order, head first
        b = chain_best(ctx, (*perm[1:], perm[0]))
        if b is None:
            continue
        key = (ring_cost(perm, cost), b)
        if best is None or key < best:
            best = key
    return best


def all_direct_exists(classes: list[NatClass]) -> bool:
    """Exhaustive: some cyclic order whose every edge is predicted direct."""
    m = len(classes)
    if m <= 1:
        return True
    for rest in permutations(range(1, m)):
        cyc = (0, *rest)
        if all(predict_edge(classes[cyc[i]], classes[cyc[(i + 1) % m]]) == DIRECT for i in range(m)):
            return True
    return False

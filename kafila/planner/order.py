"""Ring order: the cheapest cyclic order of members by predicted edge cost.

Members are indices 0..m-1 in name order. A cycle is a tuple starting with member 0 (fixing
the first member removes the m rotations of each cycle). A cycle and its reverse cost the
same but are different pipelines (activations flow one way), so both are kept: the partition
decides between them.

Up to EXACT_LIMIT members every cycle is enumerated ((m−1)! of them, 40 320 at m = 9) and
grouped into tiers of equal cost. Beyond it, a heuristic: nearest-neighbour tours from every
start, improved by 2-opt until no move helps. Its guarantee is only that no 2-opt move
(reversing a segment) lowers the ring cost; the partition for that cycle and its reverse is
still exact over all head rotations.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations

EXACT_LIMIT = 9

Cycle = tuple[int, ...]


def cycle_edges(cycle: Sequence[int]) -> list[tuple[int, int]]:
    """The m edges a token crosses in one circuit; m = 2 gives the one pair twice, m = 1 none."""
    m = len(cycle)
    if m <= 1:
        return []
    return [(cycle[i], cycle[(i + 1) % m]) for i in range(m)]


def ring_cost(cycle: Sequence[int], cost: Sequence[Sequence[int]]) -> int:
    """Sum of the predicted edge costs of the cycle."""
    return sum(cost[a][b] for a, b in cycle_edges(cycle))


def cost_tiers(cost: Sequence[Sequence[int]]) -> list[tuple[int, list[Cycle]]]:
    """Every cycle (first member fixed), grouped by ring cost, cheapest tier first."""
    m = len(cost)
    if m == 1:
        return [(0, [(0,)])]
    tiers: dict[int, list[Cycle]] = {}
    for rest in permutations(range(1, m)):
        cycle = (0, *rest)
        tiers.setdefault(ring_cost(cycle, cost), []).append(cycle)
    return sorted(tiers.items())


def heuristic_cycle(cost: Sequence[Sequence[int]]) -> Cycle:
    """A 2-opt-optimal cycle for rings too large to enumerate (see module doc for the guarantee)."""
    m = len(cost)
    best: list[int] | None = None
    for start in range(m):
        tour = [start]
        left = set(range(m)) - {start}
        while left:
            nxt = min(left, key=lambda j: (cost[tour[-1]][j], j))
            tour.append(nxt)
            left.remove(nxt)
        tour = _two_opt(tour, cost)
        if best is None or ring_cost(tour, cost) < ring_cost(best, cost):
            best = tour
    assert best is not None
    i = best.index(0)
    return tuple(best[i:] + best[:i])


def _two_opt(tour: list[int], cost: Sequence[Sequence[int]]) -> list[int]:
    m = len(tour)
    improved = True
    while improved:
        improved = False
        for i in range(m - 1):
            for j in range(i + 2, m if i else m - 1):
                a, b, c, d = tour[i], tour[i + 1], tour[j], tour[(j + 1) % m]
                if cost[a][c] + cost[b][d] < cost[a][b] + cost[c][d]:
                    tour[i + 1 : j + 1] = reversed(tour[i + 1 : j + 1])
                    improved = True
    return tour

"""Baselines reported beside every plan, on the same ring order and head as the plan (only the split differs).

- uniform: GPipe-style even split by block count; the first k mod m members of the chain take
  one block more.
- memory: exo's RingMemoryWeightedPartitioningStrategy: each member's share of [0, 1) is its
  memory over the fleet's total, boundaries rounded to 5 decimals, layers int(start·k) to
  int(end·k), the last boundary forced to k. exo sorts nodes by memory; here the ring order is
  kept so the comparison isolates the split. exo drops members whose share rounds to no layer;
  a bounded group must use every member, so that makes the baseline unable to place the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafila.planner.cost import Ctx
from kafila.planner.placement import Placement, describe, unplaced
from kafila.planner.spec import Member


def _chain(order: Sequence[int]) -> list[int]:
    return [*order[1:], order[0]]


def _by_order(
    order: Sequence[int], chain: Sequence[int], chain_ranges: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    by_member = dict(zip(chain, chain_ranges, strict=True))
    return [by_member[i] for i in order]


def uniform(ctx: Ctx, members: Sequence[Member], order: Sequence[int]) -> Placement:
    """Even split by block count over the chain (head last)."""
    k, m = ctx.k, len(order)
    q, r = divmod(k, m)
    bounds = [0]
    for p in range(m):
        bounds.append(bounds[-1] + q + (1 if p < r else 0))
    chain_ranges = [(bounds[p], bounds[p + 1]) for p in range(m)]
    return describe("uniform", ctx, members, order, _by_order(order, _chain(order), chain_ranges))


def memory_proportional(ctx: Ctx, members: Sequence[Member], order: Sequence[int]) -> Placement:
    """exo's memory-weighted split over the chain (head last)."""
    k = ctx.k
    chain = _chain(order)
    total = sum(ctx.M[i] for i in chain)
    start = 0.0
    bounds = [0]
    for i in chain:
        end = round(start + ctx.M[i] / total, 5)
        bounds.append(int(end * k))
        start = end
    bounds[-1] = k
    chain_ranges = [(bounds[p], bounds[p + 1]) for p in range(len(chain))]
    empty = [members[i].name for i, (a, e) in zip(chain, chain_ranges, strict=True) if e <= a]
    if empty:
        return unplaced(
            "memory", members, order, f"exo's memory-proportional split gives no block to {', '.join(empty)}"
        )
    return describe("memory", ctx, members, order, _by_order(order, chain, chain_ranges))

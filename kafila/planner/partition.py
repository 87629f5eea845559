"""Exact chain-on-chain partition over a set of ring orders, with head rotation (DESIGN §3).

A ring order with its head gives a chain: the members after the head in ring order, then the
head, whose range is last. Each chain position gets a contiguous, non-empty block range.

The bottleneck B* is the smallest B for which some allowed chain has a partition with every
stage time ≤ B and every member within memory. B* is always the stage time of some member
(in the head role or not) on some contiguous range, so the candidates are those values,
sorted; `test(B)` is monotone in B, and bisection over the candidates finds B* exactly,
whatever the block sizes.

Stage time o + n·p + bytes/b grows with every block added whatever the sizes, so a member's reach
from a start is still one binary search (on its "effective bytes" prefix S[e] + e·p·b, settled with
the exact formula). A cut rule (every stage holds a flagged block: ModelSpec.must_hold) turns a
start j's ends into [first_end[j], reach(j)]; starts between two flagged blocks share first_end,
so each such group adds one interval of ends, and the head and the reconstruction take the
latest start the rule allows (fewer blocks is still easier).

`test(B)` is the feasibility pass. The textbook greedy ("give each member the most blocks it
can take") is not exact here: because every member needs at least one block, taking the most
can leave the next member facing a block too large for it. So the pass tracks every
reachable end position, as sorted disjoint intervals; a member's reach is monotone in its
start, so each interval extends in a few binary searches. One pass over a chain costs
O(m · log k) when no single block is too large for a member.

Allowed chains are either every chain (one subset pass: the reachable ends after any
ordering of a set of members depend only on the set, 2^m states) or the rotations of an
explicit list of cycles (a DAG over (head, set placed, last placed): for cycles of equal ring
cost, prefixes with the same head, set and last member have equal cost, so any path through
it is one of the allowed cycles).

Ties between chains at B* go to the lexicographically smallest order (head first, then ring
order, by member name), found by depth-first search in name order.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafila.planner.cost import Ctx, stage_time
from kafila.planner.order import Cycle

Intervals = list[tuple[int, int]]  # sorted, disjoint, inclusive [lo, hi] sets of block positions
INF = math.inf


@dataclass(frozen=True)
class OrderSet:
    """Which ring orders the search may use: all of them, or the given cycles (first member 0)."""

    cycles: tuple[Cycle, ...] | None = None  # None: every order

    @property
    def every_order(self) -> bool:
        """True when all (m−1)! cycles are allowed."""
        return self.cycles is None


@dataclass(frozen=True)
class Solution:
    """One chain and its optimal ranges: order[0] is the head; ranges follow order[1:], then the head."""

    order: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]  # per member index of `order`
    bottleneck: float


def _reach(ctx: Ctx, i: int, head: bool, j: int, end_cap: int, B: float) -> int:
    """Largest e ≤ end_cap with [j, e) within B and memory for member i; j when not even one block fits.

    The cut rule is not applied here: a stage starting at j must also end at ≥ first_end[j].
    """
    if B == INF:
        e_time = end_cap
    else:
        # Guess from the budget in "effective bytes" (bytes + per-block time × bandwidth), then settle with
        # the exact stage-time formula, which grows with e (rounding may move the guess by a position or two).
        Q, o, b, extra = ctx.Q[i], ctx.o[i], ctx.b[i], ctx.U[i] if head else 0
        e_time = max(j, bisect_right(Q, Q[j] + (B - o) * b - extra, j, end_cap + 1) - 1)
        while e_time > j and ctx.time(i, j, e_time, head) > B:
            e_time -= 1
        while e_time < end_cap and ctx.time(i, j, e_time + 1, head) <= B:
            e_time += 1
    room = ctx.M[i] - (ctx.H if head else 0)
    e_mem = bisect_right(ctx.W, ctx.W[j] + room, j, end_cap + 1) - 1
    return max(j, min(e_time, e_mem))


def _extend(ctx: Ctx, i: int, R: Intervals, end_cap: int, B: float) -> Intervals:
    """End positions reachable when non-head member i takes ≥ 1 block after any start in R."""
    if ctx.ruled:
        return _extend_ruled(ctx, i, R, end_cap, B)
    out: Intervals = []
    for x, y in R:
        y = min(y, end_cap - 1)
        j = x
        while j <= y:
            e = _reach(ctx, i, False, j, end_cap, B)
            if e == j:  # block j alone is too big for member i: no range may start here
                j += 1
                continue
            # Every start in [j, J] is good and reaches at least e, so their ranges cover [j+1, reach(J)].
            J = min(y, e)
            if J > j:
                e = max(e, _reach(ctx, i, False, J, end_cap, B))
            if out and out[-1][1] >= j:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((j + 1, e))
            j = J + 1
    return out


def _extend_ruled(ctx: Ctx, i: int, R: Intervals, end_cap: int, B: float) -> Intervals:
    """`_extend` under a cut rule: a stage starting at j may end anywhere in [first_end[j], reach(j)].

    Starts between two flagged blocks share one first_end L; their reaches grow with the start, so
    the ends they give are exactly [L, reach(largest such start)] when that reach is ≥ L.
    """
    out: Intervals = []
    for x, y in R:
        y = min(y, end_cap - 1)
        j = x
        while j <= y:
            L = ctx.first_end[j]
            if L > end_cap:
                break  # no flagged block left before the cap: no later start in this interval works either
            top = min(y, L - 1)  # the last start whose first_end is L (the flagged block itself)
            e = _reach(ctx, i, False, top, end_cap, B)
            if e >= L:
                if out and out[-1][1] >= L - 1:
                    out[-1] = (out[-1][0], max(out[-1][1], e))
                else:
                    out.append((L, e))
            j = top + 1
    return out


def _union(a: Intervals, b: Intervals) -> Intervals:
    if not a:
        return b
    if not b:
        return a
    out: Intervals = []
    for lo, hi in sorted(a + b):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _head_ok(ctx: Ctx, h: int, R: Intervals, B: float) -> bool:
    # The head takes [j, k); fewer blocks is easier, so the largest reachable j the cut rule allows decides.
    j = _latest(R, ctx.last_start[ctx.k])
    return j is not None and j < ctx.k and _reach(ctx, h, True, j, ctx.k, B) == ctx.k


def _latest(R: Intervals, limit: int) -> int | None:
    """The largest position in R that is ≤ limit, or None."""
    best = None
    for lo, hi in R:
        if lo <= limit:
            best = min(hi, limit)
    return best


def _end_cap(ctx: Ctx, position: int) -> int:
    # Chain position p (0-based) must leave one block for each of the m − 1 − p members after it.
    return ctx.k - (ctx.m - 1 - position)


class _Dag:
    """Prefix states (head, placed-set, last) of the rotations of a list of equal-cost cycles."""

    def __init__(self, m: int, cycles: Sequence[Cycle]) -> None:
        self.children: dict[tuple[int, int, int], set[int]] = {}
        for cycle in cycles:
            for r in range(m):
                order = cycle[r:] + cycle[:r]
                h, mask, last = order[0], 0, -1
                for nxt in order[1:]:
                    self.children.setdefault((h, mask, last), set()).add(nxt)
                    mask, last = mask | (1 << nxt), nxt
                self.children.setdefault((h, mask, last), set())
        self.levels: list[list[tuple[int, int, int]]] = [[] for _ in range(m)]
        for node in sorted(self.children):
            self.levels[node[1].bit_count()].append(node)


def make_tester(ctx: Ctx, orders: OrderSet) -> Callable[[float], bool]:
    """test(B): does some allowed chain have a partition with bottleneck ≤ B within memory?"""
    m = ctx.m
    if orders.every_order:
        masks = sorted(range(1, 1 << m), key=int.bit_count)

        def test_all(B: float) -> bool:
            R: dict[int, Intervals] = {0: [(0, 0)]}
            for mask in masks:
                size = mask.bit_count()
                if size == m:
                    break
                acc: Intervals = []
                for i in range(m):
                    bit = 1 << i
                    if mask & bit and R.get(mask ^ bit):
                        acc = _union(acc, _extend(ctx, i, R[mask ^ bit], _end_cap(ctx, size - 1), B))
                R[mask] = acc
            full = (1 << m) - 1
            return any(_head_ok(ctx, h, R.get(full ^ (1 << h), []), B) for h in range(m))

        return test_all

    assert orders.cycles is not None
    dag = _Dag(m, orders.cycles)

    def test_dag(B: float) -> bool:
        R: dict[tuple[int, int, int], Intervals] = {(h, 0, -1): [(0, 0)] for h in range(m)}
        # Different heads and paths often reach the same ends: extend each (member, ends, cap) once.
        seen: dict[tuple[int, tuple[tuple[int, int], ...], int], Intervals] = {}
        for level in range(m - 1):
            for node in dag.levels[level]:
                here = R.get(node)
                if not here:
                    continue
                h, mask, _ = node
                key_here = tuple(here)
                for nxt in dag.children[node]:
                    key = (nxt, key_here, level)
                    ext = seen.get(key)
                    if ext is None:
                        ext = seen[key] = _extend(ctx, nxt, here, _end_cap(ctx, level), B)
                    if ext:
                        child = (h, mask | (1 << nxt), nxt)
                        R[child] = _union(R.get(child, []), ext)
        return any(_head_ok(ctx, node[0], R.get(node, []), B) for node in dag.levels[m - 1])

    return test_dag


def candidates(ctx: Ctx) -> list[float]:
    """Every stage time any member could have on any contiguous range, in either role, sorted."""
    S, k = ctx.S, ctx.k
    # (blocks, bytes) pairs: O(k) distinct ones when blocks are equal, O(k²) at worst
    shapes = sorted({(e - a, S[e] - S[a]) for a in range(k) for e in range(a + 1, k + 1)})
    values: set[float] = set()
    for i in range(ctx.m):
        o, p, b, U = ctx.o[i], ctx.p[i], ctx.b[i], ctx.U[i]
        values.update(stage_time(o, p, b, n, d) for n, d in shapes)
        values.update(stage_time(o, p, b, n, d, U) for n, d in shapes)
    return sorted(values)


def _select(ctx: Ctx, orders: OrderSet, B: float) -> tuple[int, ...] | None:
    """The lexicographically smallest allowed order (head first) with a partition within B."""
    m = ctx.m
    dag = None if orders.every_order else _Dag(m, orders.cycles or ())
    failed: set[tuple[int, int, int, tuple[tuple[int, int], ...]]] = set()

    def dfs(h: int, mask: int, last: int, R: Intervals, prefix: list[int]) -> list[int] | None:
        if len(prefix) == m - 1:
            return prefix if _head_ok(ctx, h, R, B) else None
        key = (h, mask, last if dag else -1, tuple(R))
        if key in failed:
            return None
        if dag is None:
            nexts = [i for i in range(m) if i != h and not mask & (1 << i)]
        else:
            nexts = sorted(dag.children.get((h, mask, last), ()))
        for i in nexts:
            ext = _extend(ctx, i, R, _end_cap(ctx, len(prefix)), B)
            if ext:
                found = dfs(h, mask | (1 << i), i, ext, [*prefix, i])
                if found is not None:
                    return found
        failed.add(key)
        return None

    for h in range(m):
        found = dfs(h, 0, -1, [(0, 0)], [])
        if found is not None:
            return (h, *found)
    return None


def ranges_for(ctx: Ctx, order: Sequence[int], B: float) -> tuple[tuple[int, int], ...] | None:
    """Ranges for this order (head first) within B, earlier members taking as much as they can."""
    m = ctx.m
    chain = [*order[1:], order[0]]
    reach: list[Intervals] = [[(0, 0)]]
    for p, i in enumerate(chain[:-1]):
        reach.append(_extend(ctx, i, reach[-1], _end_cap(ctx, p), B))
    if not _head_ok(ctx, chain[-1], reach[-1], B):
        return None
    ends = [ctx.k]
    for p in range(m - 1, 0, -1):
        # The largest reachable end that may start the stage ending at `end` works whenever any does
        # (fewer blocks is easier, and the cut rule's last_start bounds it).
        found = _latest(reach[p], ctx.last_start[ends[-1]])
        assert found is not None
        ends.append(found)
    ends.reverse()
    chain_ranges = [(0 if p == 0 else ends[p - 1], ends[p]) for p in range(m)]
    by_member = dict(zip(chain, chain_ranges, strict=True))
    return tuple(by_member[i] for i in order)


def solve(ctx: Ctx, orders: OrderSet) -> Solution | None:
    """The allowed chain and partition with the lowest bottleneck; None when nothing fits in memory."""
    test = make_tester(ctx, orders)
    if not test(INF):
        return None
    cands = candidates(ctx)
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if test(cands[mid]):
            hi = mid
        else:
            lo = mid + 1
    B = cands[lo]
    order = _select(ctx, orders, B)
    assert order is not None
    ranges = ranges_for(ctx, order, B)
    assert ranges is not None
    bottleneck = max(ctx.time(i, a, e, n == 0) for n, (i, (a, e)) in enumerate(zip(order, ranges, strict=True)))
    return Solution(order=order, ranges=ranges, bottleneck=bottleneck)


def fits(ctx: Ctx, orders: OrderSet) -> bool:
    """Whether some allowed chain fits in memory at all (time ignored)."""
    return make_tester(ctx, orders)(INF)


def select_fitting(ctx: Ctx, orders: OrderSet) -> Solution | None:
    """A memory-only layout (time ignored): the first order in name order that fits, with its ranges."""
    order = _select(ctx, orders, INF)
    if order is None:
        return None
    ranges = ranges_for(ctx, order, INF)
    assert ranges is not None
    return Solution(order=order, ranges=ranges, bottleneck=INF)

"""Brute force for the planner's property tests: every order × head × contiguous partition.

Written from DESIGN §3 and §4 alone, in exact arithmetic (Fractions of the inputs), and sharing no code
with kafila.planner: a formula copied from the code under test would check nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from itertools import combinations, permutations

from kafila.planner.reachability import NatClass
from kafila.planner.spec import Member, ModelSpec, Workload

# DESIGN §4: P–P, P–O, P–R, O–O direct; O–R, R–R and anything with unknown relayed.
_P, _O, _R = NatClass.PERMISSIVE, NatClass.ORDINARY, NatClass.RESTRICTIVE
DIRECT_PAIRS = {frozenset(p) for p in ((_P, _P), (_P, _O), (_P, _R), (_O, _O))}


def direct(a: NatClass, b: NatClass) -> bool:
    """Whether DESIGN §4 predicts a direct edge between these NAT classes."""
    return frozenset((NatClass(a), NatClass(b))) in DIRECT_PAIRS


def edge_cost(a: Member, b: Member) -> Fraction:
    """DESIGN §3: relayed r_A + r_B, predicted direct |r_A − r_B| (milliseconds, exact)."""
    ra, rb = Fraction(a.rtt_ms), Fraction(b.rtt_ms)
    return abs(ra - rb) if direct(a.nat, b.nat) else ra + rb


def cycle_cost(cycle: Sequence[Member]) -> Fraction:
    """The edges a token crosses in one circuit: none for one member, the one pair twice for two."""
    if len(cycle) == 1:
        return Fraction(0)
    return sum((edge_cost(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))), Fraction(0))


def cheapest_cycle_cost(members: Sequence[Member]) -> Fraction:
    """The lowest ring cost over every cyclic order."""
    return min(cycle_cost(p) for p in permutations(members))


def block_read(model: ModelSpec, j: int, batch: int) -> Fraction:
    """DESIGN §3 MoE: dense tensors, router, shared experts, plus n·(1 − (1 − k/n)^B) distinct routed experts."""
    s = Fraction(model.blocks_bytes[j])
    x = model.expert_bytes[j] if model.expert_bytes else 0
    if not x:
        return s
    n, k = model.experts, model.experts_used
    distinct = n * (1 - (1 - Fraction(k, n)) ** batch)
    return s - n * x + distinct * x


def stage_time(mem: Member, model: ModelSpec, a: int, e: int, head: bool, batch: int = 1) -> Fraction:
    """DESIGN §3 and §2c: t = o + |S|·p + Σ r_j / b + [head]·U / u, u the measured unembedding speed (b if none),
    r_j the bytes block j reads per call at this decode batch."""
    t = Fraction(mem.dispatch_s) + (e - a) * Fraction(mem.block_s)
    t += sum((block_read(model, j, batch) for j in range(a, e)), Fraction(0)) / Fraction(mem.bandwidth)
    if head:
        t += Fraction(model.unembed_bytes) / Fraction(mem.unembed_bandwidth or mem.bandwidth)
    return t


def need(model: ModelSpec, workload: Workload, a: int, e: int, head: bool) -> int:
    """DESIGN §3: Σ_{j∈S} (s_j + C·T·kv_j) + [head]·H bytes; a sliding-window layer's cache holds the whole context
    too (llama.cpp's swa_full, which the stage engine keeps)."""
    total = 0
    for j in range(a, e):
        total += model.blocks_bytes[j] + workload.concurrency * workload.context * model.kv_bytes_per_token[j]
    return total + (model.head_bytes if head else 0)


def cut_ok(model: ModelSpec, a: int, e: int) -> bool:
    """DESIGN §2b: no cut of a whole-only model; with window flags to hold, every stage holds a flagged block."""
    if model.whole_only and (a, e) != (0, model.k):
        return False
    return not model.must_hold or any(model.must_hold[a:e])


def chain_best(chain: Sequence[Member], model: ModelSpec, workload: Workload) -> Fraction | None:
    """Lowest bottleneck over every partition of the chain (head last) that fits in memory."""
    m, k = len(chain), model.k
    best = None
    for cuts in combinations(range(1, k), m - 1):
        bounds = (0, *cuts, k)
        times = []
        for p, mem in enumerate(chain):
            a, e, head = bounds[p], bounds[p + 1], p == m - 1
            if need(model, workload, a, e, head) > mem.memory or not cut_ok(model, a, e):
                break
            times.append(stage_time(mem, model, a, e, head, workload.concurrency))
        else:
            if best is None or max(times) < best:
                best = max(times)
    return best


def best_plan(members: Sequence[Member], model: ModelSpec, workload: Workload) -> tuple[Fraction, Fraction] | None:
    """(ring cost ms, bottleneck s) minimised in that order over orders and heads that fit; None if none fits."""
    best: tuple[Fraction, Fraction] | None = None
    for order in permutations(members):  # head first; activations flow in this order
        bottleneck = chain_best((*order[1:], order[0]), model, workload)
        if bottleneck is None:
            continue
        key = (cycle_cost(order), bottleneck)
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
        if all(direct(classes[cyc[i]], classes[cyc[(i + 1) % m]]) for i in range(m)):
            return True
    return False

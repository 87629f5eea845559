"""Admission: when no order and head fit in memory, say who is short and what would admit the session.

All questions are asked of the same exact memory test the planner uses (time ignored), over every
allowed order, so "would admit" answers are exact for the fleet as measured:

- shortfall: the smallest extra memory δ that, given to every member, makes some layout fit
  (to 1 MB); the members of that closest layout that exceed their own memory, and by how much;
- the most concurrent requests of the requested context that fit, and the longest context for
  the requested concurrency;
- the largest fraction of the current weight bytes that fits (to 0.1 %), and the common
  quantisations at or below it when the current bits per weight are known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafila.planner.cost import make_ctx
from kafila.planner.partition import OrderSet, fits, select_fitting
from kafila.planner.placement import gb
from kafila.planner.spec import Member, ModelSpec, Workload

# Approximate average bits per weight of llama.cpp quantisations (block formats exactly; the
# K-quant mixes as measured on 7-8B models, so a guide rather than a promise).
QUANT_BPW: dict[str, float] = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.56,
    "Q5_1": 6.0,
    "Q5_K_M": 5.68,
    "Q5_K_S": 5.54,
    "Q5_0": 5.5,
    "Q4_1": 5.0,
    "Q4_K_M": 4.84,
    "Q4_K_S": 4.58,
    "Q4_0": 4.5,
    "Q3_K_L": 4.27,
    "Q3_K_M": 3.91,
    "Q3_K_S": 3.5,
    "Q2_K": 3.35,
}


@dataclass(frozen=True)
class Shortfall:
    """A member that is short of memory in the closest-fitting layout."""

    name: str
    need: int
    has: int


@dataclass(frozen=True)
class Admission:
    """Why a session is rejected and what would admit it; `text` is the message for a person."""

    need_bytes: int  # weights + KV cache of the whole model for the workload
    have_bytes: int  # the fleet's usable memory
    shortfalls: tuple[Shortfall, ...]
    max_concurrency: int | None  # most requests of the requested context that fit; None: not even one
    max_context: int | None  # longest context for the requested concurrency; None: not even one token
    max_weight_fraction: float | None  # of the current weight bytes; None: the KV cache alone is too big
    smaller_quants: tuple[str, ...]
    text: str


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """Largest x in [lo, hi] with ok(x), for monotone ok (true below some point); None if ok(lo) fails."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def analyse(members: Sequence[Member], model: ModelSpec, workload: Workload, orders: OrderSet) -> Admission:
    """Reasons and remedies for a fleet on which nothing fits (members in name order, as the planner uses)."""
    ms = tuple(members)
    ctx = make_ctx(ms, model, workload)
    need = ctx.W[ctx.k] + ctx.H
    have = sum(ctx.M)

    def fits_with(slack: int = 0, scale: float = 1.0, wl: Workload = workload) -> bool:
        return fits(make_ctx(ms, model, wl, weight_scale=scale, memory_slack=slack), orders)

    # Shortfall: the least extra memory per member that admits some layout (to 1 MB, or finer for tiny models).
    unit = max(1, min(1_000_000, need // 1000))
    lo, hi = 0, -(-need // unit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits_with(slack=mid * unit):
            hi = mid
        else:
            lo = mid
    layout = select_fitting(make_ctx(ms, model, workload, memory_slack=hi * unit), orders)
    shortfalls: list[Shortfall] = []
    if layout is not None:
        for n, (i, (a, e)) in enumerate(zip(layout.order, layout.ranges, strict=True)):
            used = ctx.need(a, e, n == 0)
            if used > ctx.M[i]:
                shortfalls.append(Shortfall(ms[i].name, used, ctx.M[i]))
    shortfalls.sort(key=lambda s: (s.has - s.need, s.name))

    C, T = workload.concurrency, workload.context
    max_c = _largest(1, C - 1, lambda c: fits_with(wl=Workload(c, T)))
    max_t = _largest(1, T - 1, lambda t: fits_with(wl=Workload(C, t)))
    permille = _largest(1, 999, lambda f: fits_with(scale=f / 1000))
    fraction = None if permille is None else permille / 1000
    bpw = model.bits_per_weight or (QUANT_BPW.get(model.quant.upper()) if model.quant else None)
    quants: tuple[str, ...] = ()
    if fraction is not None and bpw:
        quants = tuple(q for q, bits in sorted(QUANT_BPW.items(), key=lambda x: -x[1]) if bits <= bpw * fraction)

    lines = [
        f"does not fit in memory: the model needs {gb(need)} (weights {gb(model.weight_bytes())} + KV cache for "
        f"{C} × {T} tokens {gb(need - model.weight_bytes())}); the fleet offers {gb(have)}"
    ]
    if shortfalls:
        short = [f"{s.name} short by {gb(s.need - s.has)} (needs {gb(s.need)}, has {gb(s.has)})" for s in shortfalls]
        lines.append("closest layout: " + "; ".join(short))
    remedies = []
    if max_c is not None:
        remedies.append(f"at most {max_c} concurrent request{'s' if max_c > 1 else ''} of {T} tokens")
    if max_t is not None:
        remedies.append(f"{C} request{'s' if C > 1 else ''} of at most {max_t} tokens")
    if fraction is not None:
        text = f"weights at most {fraction:.1%} of their current size"
        if bpw:
            text += f" (≤ {bpw * fraction:.2f} bits per weight, now ≈ {bpw:.2f}"
            text += f"; e.g. {', '.join(quants[:3])})" if quants else "; no common quantisation is that small)"
        remedies.append(text)
    remedies.append("more members or memory")
    lines.append("would admit: " + "; or ".join(remedies))
    if fraction is None:
        lines.append("no smaller quantisation helps: the KV cache alone does not fit")
    return Admission(
        need_bytes=need,
        have_bytes=have,
        shortfalls=tuple(shortfalls),
        max_concurrency=max_c,
        max_context=max_t,
        max_weight_fraction=fraction,
        smaller_quants=quants,
        text="\n".join(lines),
    )

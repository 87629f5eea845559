"""MoE prefill by part, for `kafila bench cost --moe` (issue 37): what a 128-row chunk costs in one block.

One random-weight block of each MoE shape is timed on a prefill call of the probe's rows, with its experts
per token patched to 1, the shape's own k and 4k: the times fall on a line in k. Its intercept is what
every row computes whatever it routes to (attention, the router, norms; neither shape has shared
experts), its slope one more routed expert per row. Both stand beside the probe's predictions (the dense
part at the dense prefill rate, each expert at its type's routed-expert rate, kafila.engine.probe.EXPERT_SHAPES),
and the block at its own k beside the prediction that charged the whole block's bytes as dense compute.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kafila.model.random_gguf import Shape

CALLS = 2  # fastest of this many prefill calls per case (0.1–1 s each here)


def experts_tried(k: int, n: int) -> tuple[int, ...]:
    """Experts per token each block is timed with: 1, the shape's k and 4k (at most n)."""
    return tuple(sorted({1, k, min(4 * k, n)}))


def measure(fit: Any, shapes: tuple[Shape, ...], folder: Path, cache: Any, threads: int) -> list[dict[str, Any]]:
    """Each MoE shape's parts, measured, beside what the probe `fit` (a ProbeResult) predicts for them."""
    from kafila.engine.call_timing import time_prefill_calls
    from kafila.engine.stage import ContextConfig, StageEngine
    from kafila.model.cut import StageSpec
    from kafila.model.describe import describe_model
    from kafila.model.random_gguf import cached_random_gguf
    from kafila.planner.spec import expert_rate

    rows = fit.prefill_rows
    config = ContextConfig(n_ctx_per_seq=max(256, rows), n_seq_max=1, n_batch=rows, n_threads=threads)
    cases: list[tuple[str, int, Path]] = []
    for shape in shapes:
        for k in experts_tried(shape.experts_used, shape.experts):
            patched = shape if k == shape.experts_used else replace(shape, name=f"{shape.name}-k{k}", experts_used=k)
            cases.append((shape.name, k, cached_random_gguf(patched, 1, folder, tokenizer=False)))
    engines = []
    try:
        for _, _, path in cases:
            engines.append(StageEngine(cache.stage(path, StageSpec(0, 1, head=False)), config, final=False))
        seconds = time_prefill_calls(engines, rows, CALLS)
    finally:
        for engine in engines:
            engine.close()
    out = []
    rates = {kind: rate for kind, rate in fit.expert_rates if rate > 0}
    for shape in shapes:
        name, own_k = shape.name, shape.experts_used
        mine = [(k, s, path) for (n, k, path), s in zip(cases, seconds, strict=True) if n == name]
        info = describe_model(mine[0][2])
        x, n_experts = info.expert_bytes[0], info.experts
        dense = info.blocks_bytes[0] - n_experts * x
        slope, intercept = np.polyfit([k for k, _, _ in mine], [s for _, s, _ in mine], 1)
        at_k = next(s for k, s, _ in mine if k == own_k)
        shared_ms = fit.predict_prefill(1, dense) * 1e3
        per_expert_ms = x / expert_rate(rates, info.expert_type, fit.prefill_bandwidth_bytes_per_s) * 1e3
        out.append({
            "shape": name, "expert_type": info.expert_type, "rows": rows, "expert_bytes": x, "experts": n_experts,
            "experts_used": own_k, "dense_bytes": dense,
            "measured_ms": {str(k): s * 1e3 for k, s, _ in mine},
            "every_row_ms": float(intercept) * 1e3, "every_row_predicted_ms": shared_ms,
            "per_expert_ms": float(slope) * 1e3, "per_expert_predicted_ms": per_expert_ms,
            "block_ms": at_k * 1e3, "block_predicted_ms": shared_ms + own_k * per_expert_ms,
            "block_error": (shared_ms + own_k * per_expert_ms) / (at_k * 1e3) - 1,
            # the old prediction: every byte of the block as dense compute (all experts for every row)
            "whole_block_predicted_ms": fit.predict_prefill(1, info.blocks_bytes[0]) * 1e3,
        })
    return out


def table(parts: list[dict[str, Any]]) -> Any:
    """The parts as a rich table."""
    from rich.table import Table

    t = Table("block", "k tried: ms", "every row ms", "predicted", "per expert ms", "predicted", "at its k ms",
              "predicted", "error", "whole block as dense",
              title="one MoE block's prefill call by part: measured (a line in experts per token) vs the probe")
    for p in parts:
        t.add_row(p["shape"], ", ".join(f"{k}: {ms:.0f}" for k, ms in p["measured_ms"].items()),
                  f"{p['every_row_ms']:.1f}", f"{p['every_row_predicted_ms']:.1f}", f"{p['per_expert_ms']:.2f}",
                  f"{p['per_expert_predicted_ms']:.2f}", f"{p['block_ms']:.1f}", f"{p['block_predicted_ms']:.1f}",
                  f"{p['block_error']:+.1%}", f"{p['whole_block_predicted_ms']:.0f}")
    return t

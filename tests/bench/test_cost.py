"""`kafila bench cost`'s timing loop: every (engine, batch) case is timed in the same rounds, with its
CPU time beside its wall time, and leaves no sequence behind; no speed thresholds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kafila.bench.cost import _fit_predict, _row_rate, time_cases
from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.model.cut import StageSpec
from kafila.model.stage_cache import StageCache
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast


def test_time_cases_times_each_batch_and_frees_its_sequences(tmp_path: Path) -> None:
    model = write_synthetic(tmp_path / "moe.gguf", "qwen3moe", n_blocks=2)
    stage = StageCache(tmp_path / "cache").stage(model, StageSpec(0, 1, head=False))
    config = ContextConfig(n_ctx_per_seq=64, n_seq_max=4, n_batch=8, n_threads=1)
    with StageEngine(stage, config, final=False) as one, StageEngine(stage, config, final=False) as four:
        times = time_cases([(one, 1), (four, 4)], calls=3, threads=1, warmup=1)
        assert len(times) == 2 and all(t.wall_s > 0 and t.cpu_s > 0 for t in times)
        # the sequences the rounds filled are free again: each may start over at position 0
        for engine, batch in ((one, 1), (four, 4)):
            rows = Rows(np.arange(batch, dtype=np.int32), np.zeros(batch, np.int32), np.ones(batch, bool))
            assert engine.run(np.ones((batch, engine.n_embd), np.float32), rows).shape == (batch, engine.n_embd)


def test_fit_predict_is_the_three_terms() -> None:
    # (bandwidth, dispatch, per-block, residual) as fit_cost returns them
    assert math.isclose(_fit_predict((1e9, 0.001, 0.0002, 0.0), 3, 2_000_000), 0.001 + 3 * 0.0002 + 0.002)


def test_the_row_rate_is_the_dense_blocks_extra_rows_over_their_extra_time() -> None:
    rows = [{"moe": False, "batch": 1, "read_bytes": 100_000_000, "cpu_ms": 20.0},
            {"moe": False, "batch": 4, "read_bytes": 100_000_000, "cpu_ms": 35.0},
            {"moe": True, "batch": 4, "read_bytes": 50_000_000, "cpu_ms": 9.0}]
    rate = _row_rate(rows)
    assert rate is not None and math.isclose(rate, 3 * 100e6 / 0.015)  # 3 more rows took 15 ms
    assert _row_rate(rows[1:]) is None  # no batch-1 time to compare with
    assert _row_rate([rows[0], {**rows[1], "cpu_ms": 19.0}]) is None  # rows cost nothing measurable


def test_moe_prefill_parts_stand_beside_the_probes_predictions(tmp_path: Path) -> None:
    from dataclasses import replace

    from kafila.bench.moe_prefill import experts_tried, measure
    from kafila.model.random_gguf import SHAPES
    from tests.shared_probe import sample_probe

    assert experts_tried(8, 128) == (1, 8, 32) and experts_tried(4, 8) == (1, 4, 8) and experts_tried(1, 2) == (1, 2)
    small = replace(SHAPES["qwen3-30b-a3b"], name="small-moe", n_embd=256, n_head=4, n_head_kv=2, n_ff=128,
                    head_dim=64, experts=8, experts_used=2)
    fit = replace(sample_probe(), prefill_rows=16)
    (part,) = measure(fit, (small,), tmp_path / "models", StageCache(tmp_path / "cache"), threads=1)
    assert set(part["measured_ms"]) == {"1", "2", "8"} and all(ms > 0 for ms in part["measured_ms"].values())
    assert part["block_ms"] == part["measured_ms"]["2"]
    x, dense = part["expert_bytes"], part["dense_bytes"]
    every_row = (fit.prefill_dispatch_s + fit.prefill_block_s + dense / fit.prefill_bandwidth_bytes_per_s) * 1e3
    assert math.isclose(part["every_row_predicted_ms"], every_row)
    assert part["expert_type"] == "Q4_0"  # sample_probe's Q4_0 experts run at 4e7 B/s
    assert math.isclose(part["per_expert_predicted_ms"], x / 4e7 * 1e3)
    assert math.isclose(part["block_predicted_ms"], every_row + 2 * part["per_expert_predicted_ms"])
    assert math.isclose(part["whole_block_predicted_ms"],
                        every_row + 8 * x / fit.prefill_bandwidth_bytes_per_s * 1e3)

"""What a sliding-window layer's KV cache holds in the stage engine: every position, not the window.

llama.cpp's context default `swa_full = true`, which the stage engine keeps (a slot trimmed back for a
reused prefix could otherwise lack cells its window still needs), gives window layers a cache as long
as the whole context and attends over all of it with a mask. The planner reserves memory and predicts
prefill on that (kafila.planner.cost.kv_positions); this is the engine fact it stands on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.engine.llama_lib import llama
from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.model.cut import StageSpec
from kafila.model.stage_cache import StageCache
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast


def test_a_window_layer_keeps_positions_far_behind_its_window(tmp_path: Path) -> None:
    model = write_synthetic(tmp_path / "gpt-oss.gguf", "gpt-oss", n_blocks=2)
    stage = StageCache(tmp_path / "cache").stage(model, StageSpec(0, 2, head=False))
    # llama.cpp pads a window cache to 256 cells (window + batch, rounded up): past 256 positions one would
    # overwrite the oldest
    positions = 1024
    with StageEngine(stage, ContextConfig(n_ctx_per_seq=positions, n_seq_max=1, n_batch=16, n_threads=1),
                     final=False) as engine:
        rng = np.random.default_rng(0)
        for start in range(0, positions, 16):
            rows = Rows(np.zeros(16, np.int32), np.arange(start, start + 16, dtype=np.int32), np.zeros(16, bool))
            engine.run(rng.standard_normal((16, engine.n_embd)).astype(np.float32), rows)
        memory = llama().llama_get_memory(engine._ctx)
        assert llama().llama_memory_seq_pos_min(memory, 0) == 0
        assert llama().llama_memory_seq_pos_max(memory, 0) == positions - 1

"""The C eval callback that reads a body stage's output: what it refuses, and what happens without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.engine import capture
from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.errors import EngineError
from kafila.model.cut import StageSpec
from kafila.model.stage_cache import StageCache

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=8)


def one_row(pos: int) -> Rows:
    return Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool))


def test_a_missing_layer_output_is_an_engine_error_not_garbage(smollm: Path, stage_cache: StageCache) -> None:
    with StageEngine(stage_cache.stage(smollm, StageSpec(0, 2, head=False)), CONFIG, final=False) as engine:
        x = np.ones((1, engine.n_embd), np.float32)
        good = engine.run(x, one_row(0))
        assert good.shape == (1, engine.n_embd) and np.isfinite(good).all()
        assert engine._capture is not None
        engine._capture._state.target = b"l_out-7"  # a layer this 2-block stage does not have
        with pytest.raises(EngineError, match=r"l_out-7 was not captured whole: .* got 0 time\(s\)"):
            engine.run(x, one_row(1))


def test_without_the_compiled_helper_the_error_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.setattr(capture, "LIBRARY", tmp_path / "_capture.so")
    capture._library.cache_clear()
    try:
        with pytest.raises(EngineError, match="make setup"):
            capture.TensorCapture("l_out-0", 8, 16)
    finally:
        capture._library.cache_clear()

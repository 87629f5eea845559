"""Stage cutting: the right tensors, renumbered; stub vocabulary on body stages; atomic cache writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.errors import ModelError
from kafila.model.cut import STUB_VOCAB, StageSpec, write_stage
from kafila.model.gguf_file import GGUFFile
from kafila.model.stage_cache import StageCache


def test_body_stage_contents(synthetic_models: dict[str, Path], tmp_path: Path) -> None:
    src = GGUFFile(synthetic_models["qwen2"])
    out = GGUFFile(write_stage(src.path, StageSpec(1, 3, head=False), tmp_path / "s.gguf"))
    assert out.get("qwen2.block_count") == 2
    assert out.get("qwen2.vocab_size") == STUB_VOCAB
    assert len(out.get("tokenizer.ggml.tokens")) == STUB_VOCAB
    assert out.tensors["token_embd.weight"].ne == (64, STUB_VOCAB)
    assert not any(n.startswith("blk.2.") for n in out.tensors)
    for name in ("attn_q.weight", "attn_q.bias", "ffn_down.weight"):
        for new, old in ((0, 1), (1, 2)):
            got = out.tensor_bytes(out.tensors[f"blk.{new}.{name}"])
            assert np.array_equal(got, src.tensor_bytes(src.tensors[f"blk.{old}.{name}"]))


def test_head_stage_keeps_tokenizer_and_output(synthetic_models: dict[str, Path], tmp_path: Path) -> None:
    src = GGUFFile(synthetic_models["llama-untied"])
    out = GGUFFile(write_stage(src.path, StageSpec(2, 4, head=True), tmp_path / "h.gguf"))
    assert out.get("tokenizer.ggml.tokens") == src.get("tokenizer.ggml.tokens")
    for name in ("token_embd.weight", "output.weight", "output_norm.weight"):
        assert np.array_equal(out.tensor_bytes(out.tensors[name]), src.tensor_bytes(src.tensors[name]))


def test_quantised_blocks_copied_raw(smollm: Path, tmp_path: Path) -> None:
    src = GGUFFile(smollm)
    out = GGUFFile(write_stage(smollm, StageSpec(28, 29, head=False), tmp_path / "q.gguf"))
    t = out.tensors["blk.0.ffn_up.weight"]
    assert t.type.name == "Q4_1" and t.ne == src.tensors["blk.28.ffn_up.weight"].ne
    assert np.array_equal(out.tensor_bytes(t), src.tensor_bytes(src.tensors["blk.28.ffn_up.weight"]))


@pytest.mark.parametrize("spec", [StageSpec(0, 5, False), StageSpec(3, 3, False), StageSpec(-1, 2, True)])
def test_range_outside_model(synthetic_models: dict[str, Path], tmp_path: Path, spec: StageSpec) -> None:
    with pytest.raises(ModelError, match="outside the model's 4 blocks"):
        write_stage(synthetic_models["llama"], spec, tmp_path / "x.gguf")


def test_interrupted_cut_leaves_nothing(synthetic_models: dict[str, Path], tmp_path: Path) -> None:
    def crash(done: int, total: int) -> None:
        if done > total // 2:
            raise KeyboardInterrupt

    dest = tmp_path / "stage.gguf"
    with pytest.raises(KeyboardInterrupt):
        write_stage(synthetic_models["llama"], StageSpec(0, 4, True), dest, crash)
    assert list(tmp_path.iterdir()) == []


def test_cache_reuses_verified_stage(synthetic_models: dict[str, Path], tmp_path: Path) -> None:
    cache = StageCache(tmp_path)
    spec = StageSpec(0, 2, False)
    first = cache.stage(synthetic_models["llama"], spec)
    mtime = first.stat().st_mtime_ns
    assert cache.stage(synthetic_models["llama"], spec) == first
    assert first.stat().st_mtime_ns == mtime
    # another source file with other content gets its own entry
    assert cache.stage(synthetic_models["qwen3"], spec) != first

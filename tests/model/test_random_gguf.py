"""Random-weight GGUFs with real block shapes: the shapes match a real file's, llama.cpp loads them, and a
random model never picks a control token (so benchmark replies run to their limit)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from kafila.engine.reference import ReferenceContext
from kafila.engine.stage import ContextConfig, Rows
from kafila.errors import ModelError
from kafila.model.embedded import default_model_path
from kafila.model.random_gguf import SHAPES, cached_random_gguf, shape_named, write_random_gguf

pytestmark = pytest.mark.fast


def shapes(path: Path) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(n) for n in t.shape) for t in gguf.GGUFReader(path).tensors}


@pytest.mark.slow
def test_smollm2_shape_matches_the_real_file(tmp_path: Path) -> None:
    real = shapes(default_model_path())
    made = shapes(write_random_gguf(tmp_path / "s.gguf", SHAPES["smollm2"], 2))
    assert {n: s for n, s in made.items() if n.startswith("blk.")} == \
        {n: s for n, s in real.items() if n.startswith(("blk.0.", "blk.1."))}
    assert made["token_embd.weight"] == real["token_embd.weight"]
    assert made["output.weight"] == real["token_embd.weight"]  # untied: the output matrix written apart


@pytest.mark.slow
def test_qwen3_blocks_have_head_norms_and_128_wide_heads(tmp_path: Path) -> None:
    s = shape_named("qwen3-32b")
    assert s.key_dim == 128 and s.n_head * s.key_dim != s.n_embd  # why key_length is written
    # block shapes of a Qwen3 file, computed without writing the multi-GB file
    tiny_qwen = type(s)("q", "qwen3", 256, 4, 2, 512, 49152, 2, 1, head_dim=128)
    made = shapes(write_random_gguf(tmp_path / "q.gguf", tiny_qwen, 1))
    assert made["blk.0.attn_q.weight"] == (256, 4 * 128) and made["blk.0.attn_k.weight"] == (256, 2 * 128)
    assert made["blk.0.attn_q_norm.weight"] == (128,)
    ref = ReferenceContext(tmp_path / "q.gguf", ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=16))
    try:  # llama.cpp's qwen3 loader takes it and computes finite logits
        rows = Rows(np.zeros(3, np.int32), np.arange(3, dtype=np.int32), np.ones(3, bool))
        assert np.isfinite(ref.run(np.array([100, 200, 300], np.int32), rows)).all()
    finally:
        ref.close()


def test_llama_cpp_loads_it_and_greedy_never_picks_a_control_token(tmp_path: Path) -> None:
    path = cached_random_gguf(SHAPES["tiny"], 3, tmp_path / "models")
    assert cached_random_gguf(SHAPES["tiny"], 3, tmp_path / "models") == path  # made once
    ref = ReferenceContext(path, ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=16))
    try:
        token = 1000
        for pos in range(24):
            logits = ref.run(np.array([token], np.int32),
                             Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool)))[0]
            assert np.isfinite(logits).all() and logits.shape == (SHAPES["tiny"].n_vocab,)
            assert (logits[:17] == 0).all()  # SmolLM2's 17 control tokens: zero rows
            token = int(np.argmax(logits))
            assert token >= 17 and logits[token] > 0
    finally:
        ref.close()


def test_bad_input_is_named() -> None:
    with pytest.raises(ModelError, match=r"unknown model shape 'llama9'.*llama3-8b"):
        shape_named("llama9")
    with pytest.raises(ModelError, match="at least one block"):
        write_random_gguf(Path("unused.gguf"), SHAPES["tiny"], 0)


def test_the_cache_lists_benchmark_models_and_not_other_models(tmp_path: Path) -> None:
    from kafila.session.delivery.cache_inventory import inventory

    made = cached_random_gguf(SHAPES["tiny"], 1, tmp_path / "models")
    other = tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"  # a model the user fetched: not the cache's to list
    other.write_bytes(b"GGUF")
    assert [(e.kind, e.path) for e in inventory(tmp_path)] == [("bench model", made)]


def test_moe_blocks_with_the_stub_vocabulary_load_and_compute(tmp_path: Path) -> None:
    real = shape_named("qwen3-30b-a3b")
    # Qwen3-30B-A3B's block layout, narrowed: 8 experts of width 128, 2 per token, 64-wide heads
    moe = type(real)("m", "qwen3moe", 256, 4, 2, 128, head_dim=64, experts=8, experts_used=2)
    path = write_random_gguf(tmp_path / "m.gguf", moe, 2, tokenizer=False)
    made = shapes(path)
    assert made["blk.1.ffn_gate_exps.weight"] == (256, 128, 8) and made["blk.1.ffn_down_exps.weight"] == (128, 256, 8)
    assert made["blk.0.ffn_gate_inp.weight"] == (256, 8) and made["blk.0.attn_k_norm.weight"] == (64,)
    assert made["token_embd.weight"] == (256, 32) and "blk.0.ffn_gate.weight" not in made
    ref = ReferenceContext(path, ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=16))
    try:  # llama.cpp's qwen3moe loader takes it and computes finite logits over the 32-token stub
        rows = Rows(np.zeros(3, np.int32), np.arange(3, dtype=np.int32), np.ones(3, bool))
        logits = ref.run(np.array([1, 2, 3], np.int32), rows)
        assert logits.shape[-1] == 32 and np.isfinite(logits).all()
    finally:
        ref.close()


def test_the_cache_keys_on_shape_blocks_and_vocabulary(tmp_path: Path) -> None:
    stub = cached_random_gguf(SHAPES["tiny"], 1, tmp_path, tokenizer=False)
    real = cached_random_gguf(SHAPES["tiny"], 1, tmp_path)
    assert stub != real and stub.stat().st_size < real.stat().st_size
    assert cached_random_gguf(SHAPES["tiny"], 2, tmp_path, tokenizer=False) != stub


def test_unwritable_shapes_are_named() -> None:
    dense = SHAPES["tiny"]
    with pytest.raises(ModelError, match="arch 'qwen3moe' with 0 experts"):
        write_random_gguf(Path("unused.gguf"), type(dense)("x", "qwen3moe", 128, 4, 2, 256), 1)
    with pytest.raises(ModelError, match="whole blocks of 32; 100 is not"):
        write_random_gguf(Path("unused.gguf"), type(dense)("x", "llama", 128, 4, 2, 100), 1)


@pytest.mark.slow
def test_gpt_oss_blocks_are_mxfp4_experts_and_q8_0_matrices_with_sinks_and_a_window(tmp_path: Path) -> None:
    from kafila.model.describe import describe_model

    real = shape_named("gpt-oss-20b")
    assert (real.experts, real.experts_used, real.window, real.expert_type) == (32, 4, 128, "MXFP4")
    # gpt-oss-20b's block layout, narrowed: 8 experts of width 128, 2 per token, a 16-token window
    oss = type(real)("o", "gpt-oss", 256, 4, 2, 128, head_dim=64, experts=8, experts_used=2, window=16,
                     matrix_type="Q8_0", expert_type="MXFP4")
    path = write_random_gguf(tmp_path / "o.gguf", oss, 2)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_down_exps.weight"] == "MXFP4" and types["blk.1.attn_q.weight"] == "Q8_0"
    assert types["blk.0.attn_sinks.weight"] == "F32" and "blk.0.ffn_norm.weight" not in types
    info = describe_model(path)
    assert info.window_layers == (True, False) and info.window_tokens == 16
    # one expert: gate, up and down (3 × 256 × 128 weights, 17 bytes per 32) and its biases in f32
    assert (info.experts, info.experts_used) == (8, 2)
    assert info.expert_bytes == (3 * 256 * 128 // 32 * 17 + 4 * (128 + 128 + 256),) * 2
    ref = ReferenceContext(path, ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=32))
    try:  # llama.cpp's gpt-oss loader takes it and computes finite logits past the window
        rows = Rows(np.zeros(24, np.int32), np.arange(24, dtype=np.int32), np.ones(24, bool))
        logits = ref.run(np.arange(100, 124, dtype=np.int32), rows)
        assert np.isfinite(logits).all() and logits.std() > 0
    finally:
        ref.close()


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shapes_default_can_be_planned_on_bench_scales_three_member_ring(name: str) -> None:
    """`bench scale --shape NAME` without :BLOCKS must run: with a window, every stage of the 3-member
    ring needs one of its window layers (gpt-oss-20b's default of 3 blocks had 2)."""
    from kafila.model.arch import SUPPORTED, swa_pattern

    shape = SHAPES[name]
    assert shape.default_blocks >= 3
    flags = swa_pattern(SUPPORTED[shape.arch], shape.default_blocks) if shape.window else None
    assert flags is None or sum(flags) >= 3, flags

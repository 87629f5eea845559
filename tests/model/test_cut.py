"""Stage cutting: the right tensors, renumbered; stub vocabulary on body stages; atomic cache writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.errors import ModelError, WorkStopped
from kafila.model.cut import PIECE, STUB_VOCAB, StageSpec, write_stage
from kafila.model.describe import describe_model
from kafila.model.gguf_file import GGUFFile
from kafila.model.stage_cache import StageCache
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast


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


def test_one_big_tensor_is_written_in_pieces_each_of_which_a_stop_can_follow(tmp_path: Path) -> None:
    source = write_synthetic(tmp_path / "big.gguf", "llama", n_blocks=2, filler_mb=20)  # 20 MiB in one tensor
    calls: list[int] = []

    def stop_in_the_second_tensor_piece(done: int, total: int) -> None:
        calls.append(done)
        if done > 10 << 20:  # inside the first filler tensor, which a per-tensor check would pass whole
            raise WorkStopped("stop")

    dest = tmp_path / "out" / "stage.gguf"
    with pytest.raises(WorkStopped):
        write_stage(source, StageSpec(0, 2, True), dest, stop_in_the_second_tensor_piece)
    assert list(dest.parent.iterdir()) == []
    assert calls[-1] - calls[-2] == PIECE and calls[-1] < 20 << 20  # stopped one piece into the 20 MiB tensor


def test_a_stop_while_the_cut_is_synced_still_leaves_nothing(synthetic_models: dict[str, Path], tmp_path: Path) -> None:
    ends: list[int] = []

    def stop_once_synced(done: int, total: int) -> None:
        if done == total:
            ends.append(done)
        if len(ends) == 2:  # the last byte written (1), then the file closed and synced (2), not yet in place
            raise WorkStopped("stop")

    with pytest.raises(WorkStopped):
        write_stage(synthetic_models["llama"], StageSpec(0, 4, True), tmp_path / "stage.gguf", stop_once_synced)
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


def test_per_layer_metadata_sliced_and_leading_count_shifted(tmp_path: Path) -> None:
    src = write_synthetic(tmp_path / "m.gguf", "llama", kv_heads=[4, 1, 2, 1], leading_dense=2)
    for spec, kv, dense in ((StageSpec(1, 3, False), [1, 2], 1), (StageSpec(3, 4, True), [1], 0),
                            (StageSpec(0, 2, False), [4, 1], 2)):
        out = GGUFFile(write_stage(src, spec, tmp_path / f"{spec.tag}.gguf"))
        assert out.get("llama.attention.head_count_kv").tolist() == kv
        assert out.get("llama.leading_dense_block_count") == dense


@pytest.mark.parametrize(("spec", "window"), [
    (StageSpec(0, 3, False), [True, True, True]),
    (StageSpec(3, 8, True), [True, True, False, True, True]),  # Gemma 3: every 6th layer is global
    (StageSpec(4, 7, False), [True, False, True]),
])
def test_window_pattern_written_per_layer(tmp_path: Path, spec: StageSpec, window: list[bool]) -> None:
    src = write_synthetic(tmp_path / "g.gguf", "gemma3", n_blocks=8)
    out = GGUFFile(write_stage(src, spec, tmp_path / "s.gguf"))
    assert out.get("gemma3.attention.sliding_window_pattern").tolist() == window
    assert out.get("gemma3.attention.sliding_window") == 16


@pytest.mark.parametrize("pattern_in_source", [False, True])
def test_gemma3_stage_of_global_layers_drops_the_window(tmp_path: Path, pattern_in_source: bool) -> None:
    src = write_synthetic(tmp_path / "g.gguf", "gemma3", n_blocks=8)
    if pattern_in_source:  # newer converters write the pattern array themselves
        whole = tmp_path / "whole.gguf"
        write_stage(src, StageSpec(0, 8, True), whole)
        assert GGUFFile(whole).get("gemma3.attention.sliding_window_pattern") is not None
        src = whole
    out = GGUFFile(write_stage(src, StageSpec(5, 6, False), tmp_path / "s.gguf"))
    assert "gemma3.attention.sliding_window" not in out.fields
    assert "gemma3.attention.sliding_window_pattern" not in out.fields


def test_gpt_oss_cut_without_window_layer_refused_before_writing(tmp_path: Path) -> None:
    src = write_synthetic(tmp_path / "o.gguf", "gpt-oss", n_blocks=6)
    with pytest.raises(ModelError, match=r"blocks \[1, 2\) of gpt-oss hold no sliding-window layer"):
        write_stage(src, StageSpec(1, 2, False), tmp_path / "s.gguf")
    assert not (tmp_path / "s.gguf").exists()
    assert describe_model(src).stage_problem(1, 2) and describe_model(src).stage_problem(1, 4) is None


def test_gpt_oss_body_stage_has_output_stub(tmp_path: Path) -> None:
    src = write_synthetic(tmp_path / "o.gguf", "gpt-oss", n_blocks=6)
    out = GGUFFile(write_stage(src, StageSpec(0, 3, False), tmp_path / "s.gguf"))
    assert out.tensors["output.weight"].ne == (64, STUB_VOCAB)


def test_gemma3_27b_block_count_runs_only_whole(tmp_path: Path) -> None:
    src = write_synthetic(tmp_path / "g.gguf", "gemma3", n_blocks=62)
    info = describe_model(src)
    assert info.stage_problem(0, 62) is None
    with pytest.raises(ModelError, match=r"llama\.cpp picks its attention scale by block count"):
        write_stage(src, StageSpec(0, 31, False), tmp_path / "s.gguf")


def test_global_tensor_copied_to_every_stage(tmp_path: Path) -> None:
    src = GGUFFile(write_synthetic(tmp_path / "l.gguf", "llama3"))
    for spec in (StageSpec(0, 2, False), StageSpec(2, 4, True)):
        out = GGUFFile(write_stage(src.path, spec, tmp_path / f"{spec.tag}.gguf"))
        assert np.array_equal(out.tensor_bytes(out.tensors["rope_freqs.weight"]),
                              src.tensor_bytes(src.tensors["rope_freqs.weight"]))


def test_gemma2_stages_after_the_first_restore_their_input(tmp_path: Path) -> None:
    src = write_synthetic(tmp_path / "g.gguf", "gemma2", n_blocks=6)
    first = GGUFFile(write_stage(src, StageSpec(0, 2, False), tmp_path / "a.gguf"))
    later = [GGUFFile(write_stage(src, spec, tmp_path / f"{spec.tag}.gguf"))
             for spec in (StageSpec(2, 4, False), StageSpec(4, 6, True))]
    assert "kafila.restore_input" not in first.fields
    assert [g.get("kafila.restore_input") for g in later] == ["inp_scaled", "inp_scaled"]
    with pytest.raises(ModelError, match=r"blocks \[5, 6\) of gemma2 hold no sliding-window layer"):
        write_stage(src, StageSpec(5, 6, True), tmp_path / "x.gguf")

"""Model description: sizes add up to the file, architectures are checked."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from kafila.errors import ModelError
from kafila.model.describe import describe_model
from kafila.model.gguf_file import GGUFFile
from tests.conftest import run_kafila
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast


def test_embedded_model(smollm: Path) -> None:
    info = describe_model(smollm)
    assert (info.arch, info.n_blocks, info.n_embd, info.quant) == ("llama", 30, 576, "Q4_1")
    assert info.tied_output and info.unembed_bytes == GGUFFile(smollm).tensors["token_embd.weight"].n_bytes
    # 3 KV heads × 64 dims × (K + V) × 2 bytes (f16 cache)
    assert info.kv_bytes_per_token == (3 * 64 * 2 * 2,) * 30
    all_tensors = sum(t.n_bytes for t in GGUFFile(smollm).tensors.values())
    assert sum(info.blocks_bytes) + info.head_bytes == all_tensors
    # the last block's FFN (the part llama.cpp computes for logit rows only): norm, gate, up and down
    reader = gguf.GGUFReader(smollm)
    ffn = {t.name: int(t.n_bytes) for t in reader.tensors if t.name.startswith("blk.29.ffn_")}
    assert sorted(ffn) == [f"blk.29.ffn_{n}.weight" for n in ("down", "gate", "norm", "up")]
    assert info.last_ffn_bytes == sum(ffn.values()) > info.blocks_bytes[29] // 2


def test_untied_head_counts_both_matrices(synthetic_models: dict[str, Path]) -> None:
    info = describe_model(synthetic_models["llama-untied"])
    tensors = GGUFFile(synthetic_models["llama-untied"]).tensors
    assert not info.tied_output
    assert info.unembed_bytes == tensors["output.weight"].n_bytes
    head = ("token_embd.weight", "output.weight", "output_norm.weight")
    assert info.head_bytes == sum(tensors[n].n_bytes for n in head)


def test_qwen3_kv_uses_key_length(synthetic_models: dict[str, Path]) -> None:
    assert describe_model(synthetic_models["qwen3"]).kv_bytes_per_token == (2 * 16 * 2 * 2,) * 4


def test_window_layers_described(tmp_path: Path) -> None:
    gemma3 = describe_model(write_synthetic(tmp_path / "g.gguf", "gemma3", n_blocks=7))
    assert gemma3.as_dict()["sliding_window_layers"] == [True] * 5 + [False, True]  # every 6th global
    gpt_oss = describe_model(write_synthetic(tmp_path / "o.gguf", "gpt-oss", n_blocks=4))
    assert gpt_oss.window_layers == (True, False, True, False)
    assert describe_model(write_synthetic(tmp_path / "l.gguf", "llama")).as_dict()["sliding_window_layers"] == []


def test_unknown_architecture(tmp_path: Path) -> None:
    p = write_synthetic(tmp_path / "starcoder2.gguf", "starcoder2")
    with pytest.raises(ModelError, match=r"unsupported architecture 'starcoder2': Kafila can split .*gemma3"):
        describe_model(p)


@pytest.mark.parametrize(("arch", "reason"), [
    ("mamba", "recurrent model"), ("rwkv7", "recurrent model"), ("qwen3next", "hybrid model"),
    ("jamba", "hybrid model"), ("t5", "encoder-decoder"), ("bert", "encoder"), ("clip", "multimodal projector"),
])
def test_refused_architecture_by_name(tmp_path: Path, arch: str, reason: str) -> None:
    # Refused from the metadata alone, before any tensor is looked at: a header is enough.
    writer = gguf.GGUFWriter(tmp_path / f"{arch}.gguf", arch)
    writer.add_block_count(4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with pytest.raises(ModelError, match=f"architecture '{arch}' cannot be split: .*{reason}"):
        describe_model(tmp_path / f"{arch}.gguf")


def test_inspect_cli_json(synthetic_models: dict[str, Path]) -> None:
    out = run_kafila("inspect", str(synthetic_models["qwen2"]), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["arch"] == "qwen2" and len(doc["blocks_bytes"]) == 4


def test_inspect_cli_corrupt(tmp_path: Path) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 40)
    out = run_kafila("inspect", str(p))
    assert out.returncode == 1
    assert out.stderr.startswith("kafila: error:") and "Traceback" not in out.stderr


def test_moe_and_window_described_from_tensor_shapes(tmp_path: Path) -> None:
    import gguf as gg

    from tests.synthetic import N_EMBD, N_EXPERT, N_FF_EXP, WINDOW

    for arch in ("qwen3moe", "gpt-oss"):
        path = write_synthetic(tmp_path / f"{arch}.gguf", arch, n_blocks=4)
        info = describe_model(path)
        reader = gg.GGUFReader(str(path))
        routed = sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith("blk.0.") and "_exps." in t.name)
        assert (info.experts, info.experts_used) == (N_EXPERT, 2)
        assert info.expert_bytes == (routed // N_EXPERT,) * 4
        # F32 gate, up and down of one expert (gpt-oss adds their biases)
        bias = (2 * N_FF_EXP + N_EMBD) * 4 if arch == "gpt-oss" else 0
        assert routed // N_EXPERT == 3 * N_FF_EXP * N_EMBD * 4 + bias
    info = describe_model(tmp_path / "gpt-oss.gguf")
    assert info.kv_window == (WINDOW, 0, WINDOW, 0) and info.must_hold == (True, False, True, False)
    gemma = describe_model(write_synthetic(tmp_path / "g3.gguf", "gemma3", n_blocks=6))
    assert gemma.kv_window == (WINDOW,) * 5 + (0,) and gemma.must_hold == ()  # Gemma 3 drops to a plain graph


def test_inspect_shows_moe_reads_and_window_kv(tmp_path: Path) -> None:
    path = write_synthetic(tmp_path / "gpt-oss.gguf", "gpt-oss", n_blocks=4)
    out = run_kafila("inspect", str(path))
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "8 per block, 2 used per token" in text and "at batch 1" in text and "at batch 4" in text
    assert "sliding-window blocks attend to at most 16 tokens, but keep the whole context in their cache" in text

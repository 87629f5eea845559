"""Kinds of model Kafila refuses by name, with the reason, before anything is cut: recurrent and hybrid
architectures, encoder-decoders, diffusion models, multimodal projector files and adapters.

Each is a tiny GGUF carrying its architecture's metadata keys and tensor names as llama.cpp's
converters write them (the values are small; only the refusal is under test)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from kafila.errors import ModelError
from kafila.model.arch import REFUSED_KINDS, require_supported
from kafila.model.cut import StageSpec, write_stage
from kafila.model.describe import describe_model
from tests.conftest import run_kafila

pytestmark = pytest.mark.fast

SSM = {"ssm.conv_kernel": 4, "ssm.inner_size": 32, "ssm.state_size": 16, "ssm.time_step_rank": 4}
RWKV = {"wkv.head_size": 8, "time_mix_extra_dim": 4, "time_decay_extra_dim": 4, "rescale_every_n_layers": 6}
# architecture -> (its metadata keys after "<arch>.", tensor names of block 0, the reason's words)
KINDS: dict[str, tuple[dict[str, int], list[str], str]] = {
    "mamba": (SSM, ["ssm_in", "ssm_conv1d", "ssm_x", "ssm_dt", "ssm_a", "ssm_d", "ssm_out"], "a recurrent model"),
    "mamba2": ({**SSM, "ssm.group_count": 1}, ["ssm_in", "ssm_conv1d", "ssm_a", "ssm_norm"], "a recurrent model"),
    "rwkv6": (RWKV, ["time_mix_key", "time_mix_value", "channel_mix_key"], "a recurrent model"),
    "rwkv7": ({"wkv.head_size": 8, "attention.decay_lora_rank": 4}, ["time_mix_w0", "time_mix_k_k"],
              "a recurrent model"),
    "jamba": (SSM, ["ssm_in", "attn_q", "ffn_gate_exps"], "a hybrid model"),
    "falcon-h1": ({**SSM, "attention.head_count": 4}, ["ssm_in", "attn_q", "ffn_up"], "a hybrid model"),
    "granitehybrid": ({**SSM, "attention.head_count": 4}, ["ssm_in", "attn_q"], "a hybrid model"),
    "lfm2": ({"shortconv.l_cache": 3, "attention.head_count": 4}, ["shortconv.conv", "attn_q"], "a hybrid model"),
    "qwen3next": ({**SSM, "attention.head_count": 4}, ["ssm_in", "attn_q", "ffn_gate_exps"], "a hybrid model"),
    "t5": ({"attention.relative_buckets_count": 32, "decoder_start_token_id": 0}, ["attn_q"], "an encoder-decoder"),
    "t5encoder": ({"attention.relative_buckets_count": 32}, ["attn_q"], "an encoder-decoder"),
    "dream": ({"attention.head_count": 4}, ["attn_q"], "a diffusion language model"),
    "clip": ({"projection_dim": 64, "vision.image_size": 224}, ["attn_q"], "a multimodal projector file"),
}


def write_kind(path: Path, arch: str, keys: dict[str, int], block_tensors: list[str], general_type: str = "") -> Path:
    """A two-block GGUF of `arch` with the given keys and block tensors (F32, 16 wide)."""
    writer = gguf.GGUFWriter(path, arch)
    if general_type:
        writer.add_type(general_type)
    writer.add_block_count(2)
    writer.add_embedding_length(16)
    for key, value in keys.items():
        writer.add_uint32(f"{arch}.{key}", value)
    prefix = {"t5": "enc.blk", "t5encoder": "enc.blk", "clip": "v.blk"}.get(arch, "blk")
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), np.float32))
    for i in range(2):
        for name in block_tensors:
            writer.add_tensor(f"{prefix}.{i}.{name}.weight", np.zeros((16, 16), np.float32))
    if arch == "t5":
        writer.add_tensor("dec.blk.0.attn_q.weight", np.zeros((16, 16), np.float32))
    writer.add_tensor("output_norm.weight", np.ones(16, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", list(KINDS))
def test_refused_by_name_before_anything_is_cut(tmp_path: Path, arch: str) -> None:
    keys, tensors, reason = KINDS[arch]
    model = write_kind(tmp_path / f"{arch}.gguf", arch, keys, tensors)
    with pytest.raises(ModelError, match=rf"architecture '{arch}' cannot be split: {reason}"):
        describe_model(model)
    with pytest.raises(ModelError, match=rf"'{arch}' cannot be split: {reason}"):
        write_stage(model, StageSpec(0, 1, head=False), tmp_path / "stage.gguf")
    assert list(tmp_path.iterdir()) == [model]  # nothing written, not even a temporary file


def llama_cpp_kinds() -> dict[str, str]:
    """Every architecture the gguf package (llama.cpp's own tables) knows that keeps a recurrent state or has a
    decoder, with the reason it cannot be split, read from its tensor list: state tensors (SSM, RWKV time mix,
    short convolutions) alone make a recurrent model, beside attention a hybrid one; decoder tensors an
    encoder-decoder."""
    kinds = {}
    for arch, tensors in gguf.MODEL_TENSORS.items():
        names = {t.name for t in tensors}
        recurrent = any(n.startswith(("SSM_", "TIME_MIX_", "SHORTCONV_")) for n in names)
        attention = bool(names & {"ATTN_Q", "ATTN_QKV", "ATTN_Q_A"})
        if recurrent:
            kinds[gguf.MODEL_ARCH_NAMES[arch]] = "a hybrid model" if attention else "a recurrent model"
        elif any(n.startswith("DEC_") for n in names) or gguf.MODEL_ARCH_NAMES[arch] == "t5encoder":
            kinds[gguf.MODEL_ARCH_NAMES[arch]] = "an encoder-decoder"  # t5encoder: T5's encoder half alone
    return kinds


LLAMA_CPP_KINDS = llama_cpp_kinds()


def test_llama_cpps_tables_name_the_kinds_the_brief_lists() -> None:
    """The ground truth below is not empty or off: it holds the brief's kinds, each as what it is."""
    for arch in ("mamba", "mamba2", "rwkv6", "rwkv7"):
        assert LLAMA_CPP_KINDS[arch] == "a recurrent model"
    for arch in ("jamba", "falcon-h1", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "plamo2", "qwen3next"):
        assert LLAMA_CPP_KINDS[arch] == "a hybrid model"
    for arch in ("t5", "t5encoder"):
        assert LLAMA_CPP_KINDS[arch] == "an encoder-decoder"


@pytest.mark.parametrize("arch", sorted(LLAMA_CPP_KINDS))
def test_every_recurrent_hybrid_and_encoder_decoder_kind_llama_cpp_knows_is_refused_as_what_it_is(arch: str) -> None:
    with pytest.raises(ModelError, match=rf"^architecture '{arch}' cannot be split: {LLAMA_CPP_KINDS[arch]}"):
        require_supported(arch)


@pytest.mark.parametrize(("arch", "general_type", "reason"), [
    ("clip", "mmproj", "a multimodal projector file \\(mmproj\\)"),
    ("llama", "mmproj", "a multimodal projector file \\(mmproj\\)"),  # whatever its architecture says
    ("llama", "adapter", "a LoRA adapter"),
])
def test_refused_by_file_type(tmp_path: Path, arch: str, general_type: str, reason: str) -> None:
    model = write_kind(tmp_path / "x.gguf", arch, {}, ["attn_q"], general_type=general_type)
    with pytest.raises(ModelError, match=f"this GGUF cannot be split: it is {reason}"):
        describe_model(model)
    assert general_type in REFUSED_KINDS


def test_cli_names_the_reason(tmp_path: Path) -> None:
    keys, tensors, _ = KINDS["jamba"]
    out = run_kafila("inspect", str(write_kind(tmp_path / "jamba.gguf", "jamba", keys, tensors)))
    assert out.returncode == 1
    assert out.stderr.startswith("kafila: error: architecture 'jamba' cannot be split: a hybrid model")

"""Random-weight GGUFs with a real model's block shapes (DESIGN §6): the work per token is real, no download.

Weights are random Q4_0 (18 bytes per 32 weights: an f16 scale and 16 bytes of 4-bit values) with a
small fixed scale, so activations stay finite; norms are ones. The vocabulary is a 32-token stub: the
probe and benchmarks run body stages, which never see token ids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

Q4_0_BLOCK = 32  # weights per block
Q4_0_BYTES = 18  # bytes per block
SCALE = np.float16(0.002)  # small enough that random weights keep activations finite over a few blocks
VOCAB = 32


@dataclass(frozen=True)
class Shape:
    """A model's block shape (Hugging Face config.json names in comments): llama, or qwen3moe with experts."""

    name: str
    n_embd: int  # hidden_size
    n_head: int  # num_attention_heads
    n_head_kv: int  # num_key_value_heads
    n_ff: int  # intermediate_size (MoE: moe_intermediate_size, one expert's width)
    head_dim: int = 0  # head_dim when not n_embd / n_head
    experts: int = 0  # num_experts (0: a dense llama block)
    experts_used: int = 0  # num_experts_per_tok

    @property
    def arch(self) -> str:
        return "qwen3moe" if self.experts else "llama"


# Wide enough to tell the per-block cost from bandwidth, small enough for tests: 5 MB blocks.
TEST_SHAPE = Shape("test-wide", 1024, 8, 2, 2560)
SHAPES = {
    "llama3-8b": Shape("llama3-8b", 4096, 32, 8, 14336),  # Llama-3.1-8B: 123 MB per block at Q4_0
    # Qwen3-30B-A3B: 128 experts of width 768, 8 per token; 350 MB per block at Q4_0, 31 MB read at batch 1
    "qwen3-30b-a3b": Shape("qwen3-30b-a3b", 2048, 32, 4, 768, head_dim=128, experts=128, experts_used=8),
}


def _q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_0 bytes for a rows × cols matrix, as a (rows, cols/32·18) uint8 array."""
    blocks = rng.integers(0, 256, (rows, cols // Q4_0_BLOCK, Q4_0_BYTES), dtype=np.uint8)
    blocks[..., :2] = np.frombuffer(SCALE.tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def write_shaped(path: Path, shape: Shape, n_blocks: int, seed: int = 0) -> Path:
    """Write a random Q4_0 llama model of `n_blocks` blocks of `shape` to `path` (atomically)."""
    rng = np.random.default_rng(seed)
    d, hd, arch = shape.n_embd, shape.head_dim or shape.n_embd // shape.n_head, shape.arch
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(f"random-{shape.name}")
    writer.add_block_count(n_blocks)
    writer.add_context_length(4096)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    if shape.experts:
        writer.add_key_length(hd)
        writer.add_value_length(hd)
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.n_ff)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([chr(ord("a") + i) for i in range(26)] + ["ab", " ", ".", "!", "<s>", "</s>"])
    writer.add_token_types([gguf.TokenType.NORMAL] * (VOCAB - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(VOCAB - 2)
    writer.add_eos_token_id(VOCAB - 1)
    q4 = gguf.GGMLQuantizationType.Q4_0
    writer.add_tensor("token_embd.weight", (rng.standard_normal((VOCAB, d)) * 0.5).astype(np.float32))
    ones = np.ones(d, np.float32)
    for i in range(n_blocks):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones)
        for name, rows, cols in (("attn_q", shape.n_head * hd, d), ("attn_k", shape.n_head_kv * hd, d),
                                 ("attn_v", shape.n_head_kv * hd, d), ("attn_output", d, shape.n_head * hd)):
            writer.add_tensor(p + name + ".weight", _q4_0(rng, rows, cols), raw_dtype=q4)
        writer.add_tensor(p + "ffn_norm.weight", ones)
        if not shape.experts:
            for name, rows, cols in (("ffn_gate", shape.n_ff, d), ("ffn_up", shape.n_ff, d),
                                     ("ffn_down", d, shape.n_ff)):
                writer.add_tensor(p + name + ".weight", _q4_0(rng, rows, cols), raw_dtype=q4)
            continue
        writer.add_tensor(p + "attn_q_norm.weight", np.ones(hd, np.float32))
        writer.add_tensor(p + "attn_k_norm.weight", np.ones(hd, np.float32))
        # a random router: random inputs then spread over the experts about uniformly, as the model assumes
        writer.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((shape.experts, d)).astype(np.float32))
        n = shape.experts
        for name, rows, cols in (("ffn_gate_exps", shape.n_ff, d), ("ffn_up_exps", shape.n_ff, d),
                                 ("ffn_down_exps", d, shape.n_ff)):
            stacked = np.stack([_q4_0(rng, rows, cols) for _ in range(n)])
            writer.add_tensor(p + name + ".weight", stacked, raw_dtype=q4)
    writer.add_tensor("output_norm.weight", ones)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def shaped_model(folder: Path, shape: Shape | str = "llama3-8b", n_blocks: int = 2) -> Path:
    """The cached random model of that shape and block count in `folder`, written on first use."""
    s = SHAPES[shape] if isinstance(shape, str) else shape
    path = folder / f"random-{s.name}-{s.n_embd}x{s.n_ff}-{n_blocks}b-q4_0.gguf"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        write_shaped(path, s, n_blocks)
    return path

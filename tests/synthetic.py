"""Tiny random GGUF models of each supported architecture, written with the gguf writer."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 128
VOCAB = 32
# Printable single characters, so the gpt2 pre-tokenizer can round-trip simple text.
TOKENS = [chr(ord("a") + i) for i in range(26)] + ["ab", " ", ".", "!", "<s>", "</s>"]


def write_synthetic(path: Path, arch: str, n_blocks: int = 4, seed: int = 0, tied: bool = True) -> Path:
    """Write a random-weight model of `arch` (llama, qwen2, qwen3) that the bundled llama.cpp loads."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"synthetic-{arch}")
    writer.add_block_count(n_blocks)
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "qwen3":
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.NORMAL] * (VOCAB - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(VOCAB - 2)
    writer.add_eos_token_id(VOCAB - 1)
    writer.add_add_bos_token(False)

    writer.add_tensor("token_embd.weight", w(VOCAB, N_EMBD, scale=0.5))
    for i in range(n_blocks):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        writer.add_tensor(p + "attn_q.weight", w(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", w(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", w(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", w(N_EMBD, N_HEAD * HEAD_DIM))
        if arch == "qwen2":
            writer.add_tensor(p + "attn_q.bias", w(N_HEAD * HEAD_DIM))
            writer.add_tensor(p + "attn_k.bias", w(N_HEAD_KV * HEAD_DIM))
            writer.add_tensor(p + "attn_v.bias", w(N_HEAD_KV * HEAD_DIM))
        if arch == "qwen3":
            writer.add_tensor(p + "attn_q_norm.weight", norm(HEAD_DIM))
            writer.add_tensor(p + "attn_k_norm.weight", norm(HEAD_DIM))
        writer.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", norm(N_EMBD))
    if not tied:
        writer.add_tensor("output.weight", w(VOCAB, N_EMBD, scale=0.5))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

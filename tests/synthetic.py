"""Tiny random GGUF models of each supported architecture, written with the gguf writer.

Sliding-window architectures get a 16-token window, so a test prompt of a few dozen tokens goes
past it; MoE architectures get 8 experts, 2 used per token.
"""

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
WINDOW = 16
N_EXPERT = 8
N_FF_EXP = 32
# Names the tests use: an architecture, or a variant of one (llama3: Llama 3.1's rope_freqs tensor).
ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma", "gemma2", "gemma3", "gpt-oss", "llama3")
# Printable single characters, so the gpt2 pre-tokenizer can round-trip simple text.
TOKENS = [chr(ord("a") + i) for i in range(26)] + ["ab", " ", ".", "!", "<s>", "</s>"]


def write_synthetic(path: Path, arch: str, n_blocks: int = 4, seed: int = 0, tied: bool = True,
                    kv_heads: list[int] | None = None, leading_dense: int | None = None, filler_mb: int = 0) -> Path:
    """Write a random-weight model of `arch` (one of ARCHS) that the bundled llama.cpp loads.

    `kv_heads`: a KV head count per block, stored as a per-layer array (as some models do); only for
    metadata tests, since llama.cpp's llama loader wants one count for all blocks; likewise
    `leading_dense`, a leading_dense_block_count key (DeepSeek's), which llama ignores; likewise
    `filler_mb`, an extra zero tensor of that many MiB in every block, so that cutting takes a while."""
    rng = np.random.default_rng(seed)
    variant, arch = arch, ("llama" if arch == "llama3" else arch)
    tied = tied and arch != "gpt-oss"  # its loader requires output.weight (Gemma 1/2's refuses one)

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
    writer.add_head_count_kv(kv_heads or N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if leading_dense is not None:
        writer.add_leading_dense_block_count(leading_dense)
    if arch in ("qwen3", "qwen3moe", "gemma3"):
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
    if arch == "gemma2":
        writer.add_float32(f"{arch}.attn_logit_softcapping", 50.0)
        writer.add_float32(f"{arch}.final_logit_softcapping", 30.0)
    if arch in ("gemma2", "gemma3", "gpt-oss", "phi3"):  # phi3: llama.cpp reads the window and disables it
        writer.add_sliding_window(WINDOW)
    if arch == "gemma3":  # local layers rotate with another base: a wrong pattern shows at once
        writer.add_float32(f"{arch}.rope.freq_base_swa", 500.0)
    if arch in ("qwen3moe", "gpt-oss"):
        writer.add_expert_count(N_EXPERT)
        writer.add_expert_used_count(2)
        writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_tokenizer_model("gpt2")
    # llama.cpp looks up these tokens by name in any model named "phi3"; real Phi-3 vocabularies have them.
    writer.add_token_list([*TOKENS[:28], "<unk>", "<|endoftext|>", *TOKENS[30:]] if arch == "phi3" else TOKENS)
    writer.add_token_types([gguf.TokenType.NORMAL] * (VOCAB - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(VOCAB - 2)
    writer.add_eos_token_id(VOCAB - 1)
    writer.add_add_bos_token(False)

    writer.add_tensor("token_embd.weight", w(VOCAB, N_EMBD, scale=0.5))
    for i in range(n_blocks):
        p = f"blk.{i}."
        n_kv = kv_heads[i] if kv_heads else N_HEAD_KV
        writer.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        writer.add_tensor(p + "attn_q.weight", w(N_HEAD * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", w(n_kv * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", w(n_kv * HEAD_DIM, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", w(N_EMBD, N_HEAD * HEAD_DIM))
        if arch == "qwen2":
            writer.add_tensor(p + "attn_q.bias", w(N_HEAD * HEAD_DIM))
            writer.add_tensor(p + "attn_k.bias", w(n_kv * HEAD_DIM))
            writer.add_tensor(p + "attn_v.bias", w(n_kv * HEAD_DIM))
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            writer.add_tensor(p + "attn_q_norm.weight", norm(HEAD_DIM))
            writer.add_tensor(p + "attn_k_norm.weight", norm(HEAD_DIM))
        if arch in ("gemma2", "gemma3", "gpt-oss"):
            writer.add_tensor(p + "post_attention_norm.weight", norm(N_EMBD))
        if arch == "gpt-oss":
            writer.add_tensor(p + "attn_q.bias", w(N_HEAD * HEAD_DIM))
            writer.add_tensor(p + "attn_k.bias", w(n_kv * HEAD_DIM))
            writer.add_tensor(p + "attn_v.bias", w(n_kv * HEAD_DIM))
            writer.add_tensor(p + "attn_output.bias", w(N_EMBD))
            writer.add_tensor(p + "attn_sinks.weight", w(N_HEAD, scale=1.0))
        if arch in ("qwen3moe", "gpt-oss"):
            writer.add_tensor(p + "ffn_gate_inp.weight", w(N_EXPERT, N_EMBD, scale=0.5))
            writer.add_tensor(p + "ffn_gate_exps.weight", w(N_EXPERT, N_FF_EXP, N_EMBD))
            writer.add_tensor(p + "ffn_up_exps.weight", w(N_EXPERT, N_FF_EXP, N_EMBD))
            writer.add_tensor(p + "ffn_down_exps.weight", w(N_EXPERT, N_EMBD, N_FF_EXP))
        if arch == "gpt-oss":
            writer.add_tensor(p + "ffn_gate_inp.bias", w(N_EXPERT))
            writer.add_tensor(p + "ffn_gate_exps.bias", w(N_EXPERT, N_FF_EXP))
            writer.add_tensor(p + "ffn_up_exps.bias", w(N_EXPERT, N_FF_EXP))
            writer.add_tensor(p + "ffn_down_exps.bias", w(N_EXPERT, N_EMBD))
        if arch != "gpt-oss":  # gpt-oss normalises before the experts with post_attention_norm
            writer.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        if arch == "phi3":  # gate and up fused in one tensor
            writer.add_tensor(p + "ffn_up.weight", w(2 * N_FF, N_EMBD))
        elif arch not in ("qwen3moe", "gpt-oss"):
            writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
            writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        if arch not in ("qwen3moe", "gpt-oss"):
            writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
        if arch in ("gemma2", "gemma3"):
            writer.add_tensor(p + "post_ffw_norm.weight", norm(N_EMBD))
        if filler_mb:
            writer.add_tensor(p + "filler.weight", np.zeros((filler_mb * 1024, 256), np.float32))
    if variant == "llama3":  # Llama 3.1's rope scaling: one global tensor every stage needs
        writer.add_tensor("rope_freqs.weight", (1.0 + 7.0 * rng.random(HEAD_DIM // 2)).astype(np.float32))
    writer.add_tensor("output_norm.weight", norm(N_EMBD))
    if not tied:
        writer.add_tensor("output.weight", w(VOCAB, N_EMBD, scale=0.5))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

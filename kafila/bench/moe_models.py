"""Planner model files for Qwen3-30B-A3B, gpt-oss-20b and Gemma 3 27B, from their published tensor shapes.

Run `python -m kafila.bench.moe_models [DIR]` to (re)write them into DIR (default: bench/). Shapes come
from each model's Hugging Face config.json; types from the GGUF files people run:

- Qwen3-30B-A3B at Q4_K_M: hidden 2048, 48 layers, 32 query / 4 KV heads of 128, 128 routed experts
  (8 per token) of FFN width 768, no shared expert, vocabulary 151 936, untied output. llama.cpp's
  Q4_K_M mix (see kafila.bench.qwen3_models): Q4_K, with attn_v and ffn_down(_exps) Q6_K on the
  use_more_bits layers, output Q6_K; the router `ffn_gate_inp` stays F32 (llama.cpp never quantises it).
- gpt-oss-20b as ggml-org publishes it (MXFP4): hidden 2880, 24 layers, 64 query / 8 KV heads of 64,
  32 experts (4 per token) of width 2880, experts MXFP4 (17 bytes per 32 weights), every other matrix
  Q8_0 (34 bytes per 32), biases, sinks, norms and router F32; untied output; vocabulary 201 088;
  a 128-token sliding window on even layers (llama.cpp's pattern of period 2), and llama.cpp aborts
  on a stage without a window layer (DESIGN §2b), so `must_hold` carries the window flags.
- Gemma 3 27B at Q4_K_M: hidden 5376, 62 layers, 32 query / 16 KV heads of 128, FFN 21 504,
  vocabulary 262 208, tied embedding (stored Q6_K, as llama.cpp stores a tied output); a 1024-token
  window on every layer but each sixth. 62 blocks is a count at which llama.cpp picks Gemma 3 27B's
  attention scale (kafila.model.arch), so the file is `whole_only`: no ring of two or more can hold it.

KV cache per token and block: K and V, KV heads × head size values each, f16.
"""

from __future__ import annotations

import sys
from typing import Any

from kafila.bench.qwen3_models import use_more_bits, write_models

# bytes per block of 32 or 256 weights, and the block size
TYPES: dict[str, tuple[int, int]] = {"Q4_K": (144, 256), "Q6_K": (210, 256), "Q8_0": (34, 32),
                                     "MXFP4": (17, 32), "F32": (4, 1)}


def nbytes(kind: str, n: int) -> int:
    """Bytes of n weights stored as `kind`."""
    size, per = TYPES[kind]
    assert n % per == 0, (kind, n)
    return n // per * size


def kv_per_token(kv_heads: int, head_dim: int) -> int:
    """K and V of one token in one block, f16."""
    return 2 * kv_heads * head_dim * 2


def qwen3_30b_a3b() -> dict[str, Any]:
    d, L, h, g, hd, n, k, f, vocab = 2048, 48, 32, 4, 128, 128, 8, 768, 151_936
    blocks, experts = [], []
    for i in range(L):
        big = "Q6_K" if use_more_bits(i, L) else "Q4_K"
        dense = (nbytes("Q4_K", d * h * hd) + nbytes("Q4_K", d * g * hd) + nbytes(big, d * g * hd)
                 + nbytes("Q4_K", h * hd * d) + nbytes("F32", 2 * d + 2 * hd) + nbytes("F32", d * n))
        expert = 2 * nbytes("Q4_K", d * f) + nbytes(big, f * d)  # gate, up, down of one expert
        blocks.append(dense + n * expert)
        experts.append(expert)
    output = nbytes("Q6_K", vocab * d) + nbytes("F32", d)
    embed = nbytes("Q4_K", vocab * d)
    return {"name": "Qwen3-30B-A3B Q4_K_M", "quant": "Q4_K_M", "blocks_bytes": blocks,
            "kv_bytes_per_token": [kv_per_token(g, hd)] * L, "unembed_bytes": output,
            "head_bytes": output + embed, "expert_bytes": experts, "experts": n, "experts_used": k}


def gpt_oss_20b() -> dict[str, Any]:
    d, L, h, g, hd, n, k, f, vocab, window = 2880, 24, 64, 8, 64, 32, 4, 2880, 201_088, 128
    q, kv = h * hd, g * hd
    dense = (nbytes("Q8_0", d * q) + 2 * nbytes("Q8_0", d * kv) + nbytes("Q8_0", q * d)
             + nbytes("F32", q + 2 * kv + d)  # attention biases
             + nbytes("F32", h)  # sinks
             + nbytes("F32", 2 * d)  # attn_norm, post_attention_norm
             + nbytes("F32", d * n + n))  # router and its bias
    expert = 3 * nbytes("MXFP4", d * f) + nbytes("F32", 2 * f + d)  # gate, up, down and their biases
    flags = [il % 2 == 0 for il in range(L)]
    output = nbytes("Q8_0", vocab * d) + nbytes("F32", d)
    embed = nbytes("Q8_0", vocab * d)
    return {"name": "gpt-oss-20b MXFP4", "quant": "MXFP4", "blocks_bytes": [dense + n * expert] * L,
            "kv_bytes_per_token": [kv_per_token(g, hd)] * L, "unembed_bytes": output,
            "head_bytes": output + embed, "expert_bytes": [expert] * L, "experts": n, "experts_used": k,
            "kv_window": [window if w else 0 for w in flags], "must_hold": flags}


def gemma3_27b() -> dict[str, Any]:
    d, L, h, g, hd, f, vocab, window = 5376, 62, 32, 16, 128, 21_504, 262_208, 1024
    blocks = []
    for i in range(L):
        big = "Q6_K" if use_more_bits(i, L) else "Q4_K"
        blocks.append(nbytes("Q4_K", d * h * hd) + nbytes("Q4_K", d * g * hd) + nbytes(big, d * g * hd)
                      + nbytes("Q4_K", h * hd * d) + 2 * nbytes("Q4_K", d * f) + nbytes(big, f * d)
                      + nbytes("F32", 4 * d + 2 * hd))  # four norms around attention and FFN, q/k norms
    embed = nbytes("Q6_K", vocab * d) + nbytes("F32", d)  # tied: the embedding is the output
    flags = [il % 6 < 5 for il in range(L)]
    return {"name": "Gemma 3 27B Q4_K_M", "quant": "Q4_K_M", "blocks_bytes": blocks,
            "kv_bytes_per_token": [kv_per_token(g, hd)] * L, "unembed_bytes": embed, "head_bytes": embed,
            "kv_window": [window if w else 0 for w in flags], "whole_only": True}


MODELS = {"qwen3-30b-a3b-q4_k_m": qwen3_30b_a3b, "gpt-oss-20b-mxfp4": gpt_oss_20b, "gemma3-27b-q4_k_m": gemma3_27b}


def main(argv: list[str]) -> int:
    return write_models(argv, {stem: make() for stem, make in MODELS.items()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Planner model files for Qwen3-8B, -14B and -32B at Q4_K_M, computed from the published architectures.

Run `python -m kafila.bench.qwen3_models [DIR]` to (re)write DIR/qwen3-{8b,14b,32b}-q4_k_m.json
(default: bench/). The arithmetic:

- Architectures (Hugging Face config.json of Qwen/Qwen3-*): hidden size d, layers L, query
  heads h, KV heads g, head_dim 128, intermediate size f, vocabulary 151 936, untied output.
- Per block, weights (rows × columns): attn_q d×h·128, attn_k and attn_v d×g·128,
  attn_output h·128×d, ffn_gate and ffn_up d×f, ffn_down f×d; F32 vectors attn_norm and
  ffn_norm (d each), attn_q_norm and attn_k_norm (128 each).
- llama.cpp's Q4_K_M mix (llama_tensor_get_type): Q4_K (4.5 bits per weight: 144 bytes per
  256) by default; attn_v and ffn_down become Q6_K (6.5625 bits: 210 bytes per 256) on the
  layers where use_more_bits(i, L) holds — i < L/8, or i ≥ 7L/8, or (i − L/8) mod 3 = 2 —
  which is why block sizes differ; output.weight is Q6_K; token_embd is Q4_K.
- KV cache per token and block: K and V, g·128 values each, f16: 2 · g · 128 · 2 bytes.
- Head: head_bytes = token_embd + output + output_norm (F32); unembed_bytes (read every
  token) = output + output_norm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEAD_DIM = 128
VOCAB = 151_936
BYTES_PER_256 = {"Q4_K": 144, "Q6_K": 210}

ARCHS: dict[str, dict[str, int]] = {
    "Qwen3-8B": {"d": 4096, "L": 36, "h": 32, "g": 8, "f": 12288},
    "Qwen3-14B": {"d": 5120, "L": 40, "h": 40, "g": 8, "f": 17408},
    "Qwen3-32B": {"d": 5120, "L": 64, "h": 64, "g": 8, "f": 25600},
}


def _q(kind: str, n: int) -> int:
    """Bytes of n weights stored as a K-quant (n is a multiple of 256 for every Qwen3 tensor)."""
    assert n % 256 == 0
    return n // 256 * BYTES_PER_256[kind]


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which layers get the larger type in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def model_file(name: str) -> dict[str, Any]:
    """The planner model-file object for one architecture at Q4_K_M."""
    a = ARCHS[name]
    d, L, h, g, f = a["d"], a["L"], a["h"], a["g"], a["f"]
    q_out, kv_out = h * HEAD_DIM, g * HEAD_DIM
    blocks = []
    params = 0
    for i in range(L):
        more = use_more_bits(i, L)
        weights = (
            _q("Q4_K", d * q_out)  # attn_q
            + _q("Q4_K", d * kv_out)  # attn_k
            + _q("Q6_K" if more else "Q4_K", d * kv_out)  # attn_v
            + _q("Q4_K", q_out * d)  # attn_output
            + 2 * _q("Q4_K", d * f)  # ffn_gate, ffn_up
            + _q("Q6_K" if more else "Q4_K", f * d)  # ffn_down
        )
        vectors = 4 * (2 * d + 2 * HEAD_DIM)  # attn_norm, ffn_norm, attn_q_norm, attn_k_norm in F32
        blocks.append(weights + vectors)
        params += d * q_out + 2 * d * kv_out + q_out * d + 3 * d * f + 2 * d + 2 * HEAD_DIM
    output = _q("Q6_K", VOCAB * d) + 4 * d
    embed = _q("Q4_K", VOCAB * d)
    params += 2 * VOCAB * d + d
    total = sum(blocks) + output + embed
    return {
        "name": f"{name} Q4_K_M",
        "quant": "Q4_K_M",
        "bits_per_weight": round(total * 8 / params, 3),
        "params": params,
        "blocks_bytes": blocks,
        "kv_bytes_per_token": [2 * kv_out * 2] * L,
        "unembed_bytes": output,
        "head_bytes": output + embed,
    }


def write_models(argv: list[str], files: dict[str, dict[str, Any]]) -> int:
    """Write each model file as `STEM.json` in the folder argv names (default bench/), saying its size."""
    out = Path(argv[0]) if argv else Path("bench")
    out.mkdir(parents=True, exist_ok=True)
    for stem, data in files.items():
        path = out / f"{stem}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        total = sum(data["blocks_bytes"]) + data["head_bytes"]
        params = f"{data['params'] / 1e9:.2f} B params, " if "params" in data else ""
        bpw = f", {data['bits_per_weight']} bpw" if "bits_per_weight" in data else ""
        print(f"{path}: {params}{total / 1e9:.2f} GB{bpw}")
    return 0


def main(argv: list[str]) -> int:
    return write_models(argv, {f"{name.lower()}-q4_k_m": model_file(name) for name in ARCHS})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Random-weight GGUF files with a real model's block shapes, for the probe and benchmarks (DESIGN §2c, §6).

The work per token depends on the tensors' shapes and quantisation, not on their values, so a
file with Llama-3.1-8B's hidden size, heads, KV heads and FFN size, a few blocks deep, costs per
block what the real model does. Dense llama and qwen3 blocks, qwen3moe blocks (stacked experts
and a router) and gpt-oss blocks (attention biases and sinks, a sliding window on even layers, expert
biases) are written. Matrices are random quantised bytes (Q4_0; gpt-oss as ggml-org publishes it:
experts MXFP4, other matrices Q8_0) with a fixed per-block scale chosen so activations stay near unit
size; norms are near 1.

Two vocabularies: the embedded SmolLM2's tokenizer (so chats and prompts work), padded with plain
`[PADn]` tokens up to the shape's vocabulary so the head's unembedding reads a real-sized output
matrix, its control tokens' output rows zero (a random model never picks one, so replies run to
their token limit); or, with `tokenizer=False`, a 32-token stub for files whose body stages alone
are run (the probe), which keeps multi-block files free of a 0.3 GB embedding no one reads.

Files are written tensor by tensor (memory stays small for multi-GB files) and cached by
`cached_random_gguf`, keyed by shape, block count, vocabulary and `FORMAT`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from math import prod
from pathlib import Path

import gguf
import numpy as np

from kafila.errors import ModelError

FORMAT = 2  # bump when the writer's output changes, so cached files are made again
Q4_0 = gguf.GGMLQuantizationType.Q4_0
QK = 32  # weights per block of Q4_0, Q8_0 and MXFP4
Q4_0_BYTES = 18  # f16 scale + 16 bytes of 4-bit values
Q4_0_STD = 4.61  # std of (q - 8) for q uniform in 0..15
# Per type: bytes per block, the std of a weight whose block scale is 1 (random codes), and where the
# scale sits. MXFP4: one E8M0 exponent byte + 16 bytes of 4-bit E2M1 codes, which ggml decodes as
# {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12} × 2^(e − 128); Q8_0: f16 scale + 32 int8.
QUANT_BYTES = {"Q4_0": 18, "Q8_0": 34, "MXFP4": 17}
QUANT_STD = {"Q4_0": Q4_0_STD, "Q8_0": 73.9, "MXFP4": 5.85}
STUB_TOKENS = [chr(ord("a") + i) for i in range(26)] + ["ab", " ", ".", "!", "<s>", "</s>"]


@dataclass(frozen=True)
class Shape:
    """A model's block shapes (its config.json's names in comments) and how many blocks to write by default."""

    name: str
    arch: str  # llama.cpp architecture: "llama", "qwen3", "qwen3moe" or "gpt-oss"
    n_embd: int  # hidden_size
    n_head: int  # num_attention_heads
    n_head_kv: int  # num_key_value_heads
    n_ff: int  # intermediate_size (MoE: moe_intermediate_size, one expert's width)
    n_vocab: int = 49152  # vocab_size (with the real tokenizer); SmolLM2's, the smallest that holds it
    real_blocks: int = 0  # num_hidden_layers of the real model (0: not a real model)
    default_blocks: int = 3  # blocks `kafila bench scale` writes unless told (its ring has 3 members)
    head_dim: int | None = None  # when not n_embd / n_head (Qwen3)
    rope_base: float = 10000.0  # rope_theta
    experts: int = 0  # num_experts (qwen3moe)
    experts_used: int = 0  # num_experts_per_tok
    window: int = 0  # sliding_window (gpt-oss: on even layers)
    matrix_type: str = "Q4_0"  # the dense matrices' type (QUANT_BYTES)
    expert_type: str = "Q4_0"  # the routed experts' type

    @property
    def key_dim(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("llama3-8b", "llama", 4096, 32, 8, 14336, 128256, 32, 6, rope_base=500000.0),  # 123 MB per block
    Shape("llama3-70b", "llama", 8192, 64, 8, 28672, 128256, 80, 3, rope_base=500000.0),
    Shape("qwen3-8b", "qwen3", 4096, 32, 8, 12288, 151936, 36, 6, head_dim=128, rope_base=1000000.0),
    Shape("qwen3-32b", "qwen3", 5120, 64, 8, 25600, 151936, 64, 3, head_dim=128, rope_base=1000000.0),
    # 128 experts of width 768, 8 per token: 350 MB per block at Q4_0, 31 MB of it read per token
    Shape("qwen3-30b-a3b", "qwen3moe", 2048, 32, 4, 768, 151936, 48, 3, head_dim=128, rope_base=1000000.0,
          experts=128, experts_used=8),
    # 32 experts of width 2880, 4 per token, MXFP4, attention Q8_0: 453 MB per block, 82 MB read per token;
    # 6 blocks by default: every stage of bench scale's 3-member ring must hold one of its 3 window layers
    Shape("gpt-oss-20b", "gpt-oss", 2880, 64, 8, 2880, 201088, 24, 6, head_dim=64, rope_base=150000.0,
          experts=32, experts_used=4, window=128, matrix_type="Q8_0", expert_type="MXFP4"),
    Shape("smollm2", "llama", 576, 9, 3, 1536, 49152, 30, 30),
    # not a real model: the smallest file that exercises everything, for tests
    Shape("tiny", "llama", 128, 4, 2, 256, 49152, 3, 3),
)}
# Wide enough to tell the per-block cost from bandwidth, small enough for tests: 5 MB blocks.
TEST_SHAPE = Shape("test-wide", "llama", 1024, 8, 2, 2560)


def shape_named(name: str) -> Shape:
    """The shape called `name`; ModelError listing the known ones otherwise."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ModelError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}") from None


def _quantised(rng: np.random.Generator, kind: str, dims: tuple[int, ...], std: float,
               zero_rows: list[int]) -> np.ndarray:
    """Random `kind` bytes of a matrix (or stack of matrices) `dims` whose weights have about `std`, `zero_rows` 0."""
    rows, cols = prod(dims[:-1]), dims[-1]
    size = QUANT_BYTES[kind]
    data = rng.integers(0, 256, size=(rows, cols // QK, size), dtype=np.uint8)
    scale = std / QUANT_STD[kind]
    if kind == "MXFP4":  # a power of two: the nearest exponent byte, which cannot be zeroed (1 is 2^-127)
        data[:, :, 0] = 128 + round(np.log2(scale))
        data[zero_rows, :, 1:] = 0  # code 0 is 0.0
    else:
        d = np.full((rows, cols // QK), scale, np.float16)
        d[zero_rows] = 0
        data[:, :, :2] = d.view(np.uint8).reshape(rows, cols // QK, 2)
    return data.reshape(*dims[:-1], cols // QK * size)


def _tokenizer(writer: gguf.GGUFWriter, n_vocab: int) -> list[int]:
    """Copy the embedded model's tokenizer, padded to n_vocab; return the control tokens' ids."""
    from kafila.model.embedded import default_model_path

    reader = gguf.GGUFReader(default_model_path())

    def value(key: str) -> object:
        return reader.fields[key].contents()

    tokens = [str(t) for t in value("tokenizer.ggml.tokens")]  # type: ignore[attr-defined]
    types = [int(t) for t in value("tokenizer.ggml.token_type")]  # type: ignore[attr-defined]
    if len(tokens) > n_vocab:
        raise ModelError(f"a vocabulary of {n_vocab} cannot hold the tokenizer's {len(tokens)} tokens")
    pad = n_vocab - len(tokens)
    writer.add_tokenizer_model(str(value("tokenizer.ggml.model")))
    writer.add_tokenizer_pre(str(value("tokenizer.ggml.pre")))
    writer.add_token_list(tokens + [f"[PAD{i}]" for i in range(pad)])
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * pad)
    writer.add_token_merges([str(m) for m in value("tokenizer.ggml.merges")])  # type: ignore[attr-defined]
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        writer.add_uint32(f"tokenizer.ggml.{key}", int(value(f"tokenizer.ggml.{key}")))  # type: ignore[call-overload]
    writer.add_add_bos_token(bool(value("tokenizer.ggml.add_bos_token")))
    writer.add_chat_template(str(value("tokenizer.chat_template")))
    return [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL]


def _stub_tokenizer(writer: gguf.GGUFWriter) -> list[int]:
    """A 32-token vocabulary (body stages never see token ids); return the control tokens' ids."""
    n = len(STUB_TOKENS)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(STUB_TOKENS)
    writer.add_token_types([gguf.TokenType.NORMAL] * (n - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(n - 2)
    writer.add_eos_token_id(n - 1)
    return [n - 2, n - 1]


def _plan(shape: Shape, n_blocks: int, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, dims in numpy order (outputs, inputs), type: a QUANT_BYTES key or F32) of every tensor, in file order."""
    d, kd, ff = shape.n_embd, shape.key_dim, shape.n_ff
    q_out, kv_out = shape.n_head * kd, shape.n_head_kv * kd
    m, x, f32 = shape.matrix_type, shape.expert_type, "F32"
    oss = shape.arch == "gpt-oss"
    plan: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (n_vocab, d), m)]
    for i in range(n_blocks):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (d,), f32), (p + "attn_q.weight", (q_out, d), m),
                 (p + "attn_k.weight", (kv_out, d), m), (p + "attn_v.weight", (kv_out, d), m),
                 (p + "attn_output.weight", (d, q_out), m)]
        if shape.arch in ("qwen3", "qwen3moe"):
            plan += [(p + "attn_q_norm.weight", (kd,), f32), (p + "attn_k_norm.weight", (kd,), f32)]
        if oss:  # biases, one sink logit per head, and the norm before the experts in place of ffn_norm
            plan += [(p + "attn_q.bias", (q_out,), f32), (p + "attn_k.bias", (kv_out,), f32),
                     (p + "attn_v.bias", (kv_out,), f32), (p + "attn_output.bias", (d,), f32),
                     (p + "attn_sinks.weight", (shape.n_head,), f32), (p + "post_attention_norm.weight", (d,), f32)]
        else:
            plan.append((p + "ffn_norm.weight", (d,), f32))
        if shape.experts:
            n = shape.experts
            plan += [(p + "ffn_gate_inp.weight", (n, d), f32), (p + "ffn_gate_exps.weight", (n, ff, d), x),
                     (p + "ffn_up_exps.weight", (n, ff, d), x), (p + "ffn_down_exps.weight", (n, d, ff), x)]
            if oss:
                plan += [(p + "ffn_gate_inp.bias", (n,), f32), (p + "ffn_gate_exps.bias", (n, ff), f32),
                         (p + "ffn_up_exps.bias", (n, ff), f32), (p + "ffn_down_exps.bias", (n, d), f32)]
        else:
            plan += [(p + "ffn_gate.weight", (ff, d), m), (p + "ffn_up.weight", (ff, d), m),
                     (p + "ffn_down.weight", (d, ff), m)]
    return [*plan, ("output_norm.weight", (d,), f32), ("output.weight", (n_vocab, d), m)]


def write_random_gguf(path: Path, shape: Shape, n_blocks: int, seed: int = 0, tokenizer: bool = True) -> Path:
    """Write a random-weight Q4_0 model of `shape` with `n_blocks` blocks to `path`; with `tokenizer`,
    SmolLM2's tokenizer padded to the shape's vocabulary, else the 32-token stub."""
    if n_blocks < 1:
        raise ModelError(f"a model needs at least one block, not {n_blocks}")
    if (shape.arch not in ("llama", "qwen3", "qwen3moe", "gpt-oss")
            or (shape.arch in ("qwen3moe", "gpt-oss")) != bool(shape.experts)):
        raise ModelError(f"shape {shape.name!r}: arch {shape.arch!r} with {shape.experts} experts is not writable")
    for dim in (shape.n_embd, shape.n_ff, shape.key_dim):
        if dim % QK:
            raise ModelError(f"shape {shape.name!r}: a quantised row must be whole blocks of {QK}; {dim} is not")
    rng = np.random.default_rng(seed)
    n_vocab = shape.n_vocab if tokenizer else len(STUB_TOKENS)
    kd = shape.key_dim
    writer = gguf.GGUFWriter(path, shape.arch)
    writer.add_name(f"random-{shape.name}-{n_blocks}-blocks")
    writer.add_block_count(n_blocks)
    writer.add_context_length(32768)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_rope_dimension_count(kd)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if shape.expert_type == "Q4_0" else
                         gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    if shape.head_dim is not None:
        writer.add_key_length(kd)
        writer.add_value_length(kd)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.n_ff)
    if shape.window:
        writer.add_sliding_window(shape.window)
    control = _tokenizer(writer, n_vocab) if tokenizer else _stub_tokenizer(writer)

    plan = _plan(shape, n_blocks, n_vocab)
    for name, dims, kind in plan:
        if kind in QUANT_BYTES:
            row = dims[-1] // QK * QUANT_BYTES[kind]
            writer.add_tensor_info(name, (*dims[:-1], row), np.dtype(np.uint8), prod(dims[:-1]) * row,
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * prod(dims))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, kind in plan:
        if name.endswith("ffn_gate_inp.weight"):
            # a random router: random inputs then spread over the experts about uniformly, as the model assumes
            writer.write_tensor_data(rng.standard_normal(dims).astype(np.float32))
        elif name.endswith((".bias", "attn_sinks.weight")):
            writer.write_tensor_data((0.05 * rng.standard_normal(dims)).astype(np.float32))
        elif kind not in QUANT_BYTES:  # norms
            writer.write_tensor_data((1.0 + 0.05 * rng.standard_normal(dims)).astype(np.float32))
        else:
            # embeddings near unit size; a matrix's outputs near unit size for unit-size inputs
            std = 0.2 * Q4_0_STD if name == "token_embd.weight" else dims[-1] ** -0.5
            writer.write_tensor_data(_quantised(rng, kind, dims, std, control if name == "output.weight" else []))
    writer.close()
    return path


def cached_random_gguf(shape: Shape, n_blocks: int, folder: Path, tokenizer: bool = True) -> Path:
    """The random model of `shape` with `n_blocks` blocks (see write_random_gguf) in `folder`, written once."""
    vocab = f"v{shape.n_vocab}" if tokenizer else "stub"
    types = "q4_0" if (shape.matrix_type, shape.expert_type) == ("Q4_0", "Q4_0") else \
        f"{shape.matrix_type}-{shape.expert_type}".lower()
    name = f"random-{shape.name}-{shape.n_embd}x{shape.n_ff}-{n_blocks}b-{vocab}-{types}-f{FORMAT}.gguf"
    path = folder / name
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_random_gguf(tmp, shape, n_blocks, tokenizer=tokenizer)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path

"""Random-weight GGUF files with a real model's block shapes, for benchmarks at the size people run.

The work per token depends on the tensors' shapes and quantisation, not on their values, so a
file with Llama-3.1-8B's hidden size, heads, KV heads, FFN size and vocabulary, a few blocks deep,
costs per block what the real model does (DESIGN §2c, §6). Matrices are random Q4_0 bytes with a
fixed per-block scale chosen so activations stay near unit size; norms are near 1. The tokenizer
is the embedded SmolLM2's (so chats and prompts work), padded with plain `[PADn]` tokens up to the
shape's vocabulary, so the head's unembedding reads a real-sized output matrix. The rows of the
tokenizer's control tokens (end of turn among them) are zero in the output matrix: a random model
never picks one, so replies run to their token limit.

Files are written tensor by tensor (memory stays small for multi-GB files) and cached under the
user cache directory (`models/`), keyed by shape, block count and `FORMAT`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from kafila.errors import ModelError

FORMAT = 1  # bump when the writer's output changes, so cached files are made again
Q4_0 = gguf.GGMLQuantizationType.Q4_0
QK = 32  # weights per Q4_0 block
Q4_0_BYTES = 18  # f16 scale + 16 bytes of 4-bit values
Q4_0_STD = 4.61  # std of (q - 8) for q uniform in 0..15


@dataclass(frozen=True)
class Shape:
    """A model's block shapes (from its published config.json) and how many blocks to write by default."""

    name: str
    arch: str  # llama.cpp architecture: "llama" or "qwen3"
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    real_blocks: int
    default_blocks: int
    head_dim: int | None = None  # when not n_embd / n_head (Qwen3)
    rope_base: float = 10000.0

    @property
    def key_dim(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("llama3-8b", "llama", 4096, 32, 8, 14336, 128256, 32, 6, rope_base=500000.0),
    Shape("llama3-70b", "llama", 8192, 64, 8, 28672, 128256, 80, 2, rope_base=500000.0),
    Shape("qwen3-8b", "qwen3", 4096, 32, 8, 12288, 151936, 36, 6, head_dim=128, rope_base=1000000.0),
    Shape("qwen3-32b", "qwen3", 5120, 64, 8, 25600, 151936, 64, 3, head_dim=128, rope_base=1000000.0),
    Shape("smollm2", "llama", 576, 9, 3, 1536, 49152, 30, 30),
    # not a real model: the smallest file that exercises everything, for tests
    Shape("tiny", "llama", 128, 4, 2, 256, 49152, 3, 3),
)}


def shape_named(name: str) -> Shape:
    """The shape called `name`; ModelError listing the known ones otherwise."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ModelError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}") from None


def _q4_0(rng: np.random.Generator, rows: int, cols: int, scale: float, zero_rows: int = 0) -> np.ndarray:
    """Random Q4_0 bytes of a rows × cols matrix with every block's scale `scale` (rows < zero_rows: 0)."""
    if cols % QK:
        raise ModelError(f"a Q4_0 row must be whole blocks of {QK}; {cols} is not")
    data = rng.integers(0, 256, size=(rows, cols // QK, Q4_0_BYTES), dtype=np.uint8)
    d = np.full((rows, cols // QK), scale, np.float16)
    d[:zero_rows] = 0
    data[:, :, :2] = d.view(np.uint8).reshape(rows, cols // QK, 2)
    return data.reshape(rows, cols // QK * Q4_0_BYTES)


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


def write_random_gguf(path: Path, shape: Shape, n_blocks: int, seed: int = 0) -> Path:
    """Write a random-weight Q4_0 model of `shape` with `n_blocks` blocks to `path`."""
    if n_blocks < 1:
        raise ModelError(f"a model needs at least one block, not {n_blocks}")
    rng = np.random.default_rng(seed)
    d, kd = shape.n_embd, shape.key_dim
    q_out, kv_out = shape.n_head * kd, shape.n_head_kv * kd
    writer = gguf.GGUFWriter(path, shape.arch)
    writer.add_name(f"random-{shape.name}-{n_blocks}-blocks")
    writer.add_block_count(n_blocks)
    writer.add_context_length(32768)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_rope_dimension_count(kd)
    writer.add_vocab_size(shape.n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    if shape.head_dim is not None:
        writer.add_key_length(kd)
        writer.add_value_length(kd)
    control = _tokenizer(writer, shape.n_vocab)

    # (name, rows, cols) of every matrix (rows = outputs), and (name, length) of every vector, in file order
    plan: list[tuple[str, int, int] | tuple[str, int]] = [("token_embd.weight", shape.n_vocab, d)]
    for i in range(n_blocks):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", d), (p + "attn_q.weight", q_out, d), (p + "attn_k.weight", kv_out, d),
                 (p + "attn_v.weight", kv_out, d), (p + "attn_output.weight", d, q_out)]
        if shape.arch == "qwen3":
            plan += [(p + "attn_q_norm.weight", kd), (p + "attn_k_norm.weight", kd)]
        plan += [(p + "ffn_norm.weight", d), (p + "ffn_gate.weight", shape.n_ff, d),
                 (p + "ffn_up.weight", shape.n_ff, d), (p + "ffn_down.weight", d, shape.n_ff)]
    plan += [("output_norm.weight", d), ("output.weight", shape.n_vocab, d)]
    for item in plan:
        if len(item) == 3:
            writer.add_tensor_info(item[0], (item[1], item[2] // QK * Q4_0_BYTES), np.dtype(np.uint8),
                                   item[1] * item[2] // QK * Q4_0_BYTES, raw_dtype=Q4_0)
        else:
            writer.add_tensor_info(item[0], (item[1],), np.dtype(np.float32), 4 * item[1])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # the tokenizer's control tokens sort first in SmolLM2's vocabulary: zero rows of the output never win
    n_zero = max(control) + 1 if control and control == list(range(len(control))) else 0
    for item in plan:
        if len(item) == 2:
            writer.write_tensor_data((1.0 + 0.05 * rng.standard_normal(item[1])).astype(np.float32))
            continue
        name, rows, cols = item
        # embeddings near unit size; a matrix's outputs near unit size for unit-size inputs
        scale = 0.2 if name == "token_embd.weight" else 1.0 / (Q4_0_STD * cols ** 0.5)
        writer.write_tensor_data(_q4_0(rng, rows, cols, scale, n_zero if name == "output.weight" else 0))
    writer.close()
    return path


def cached_random_gguf(shape: Shape, n_blocks: int, root: Path) -> Path:
    """The random model of `shape` with `n_blocks` blocks under `root/models/`, written once."""
    path = root / "models" / f"random-{shape.name}-{n_blocks}b-q4_0-v{FORMAT}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_random_gguf(tmp, shape, n_blocks)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path

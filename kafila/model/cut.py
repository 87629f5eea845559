"""Cutting a stage GGUF: blocks [start, end) of a model, renumbered from 0, ready for llama.cpp.

Two kinds of stage (DESIGN §2):
- a *body* stage never sees token ids, so the tokenizer is replaced by a 4-token stub and
  `token_embd` by a 4-row zero tensor (the loader requires both, the stage never uses them);
- the *head* stage keeps the real tokenizer, `token_embd` (also the tied output) and `output`,
  and produces logits. Its block range is the last one of the chain.
Tensor data is copied as raw bytes, never re-quantised. What llama.cpp derives from a block's
absolute index is rewritten for the stage as its architecture profile says (arch.py): per-layer
metadata is sliced, leading-block counts shifted, the sliding-window pattern written per layer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np

from kafila.errors import ModelError
from kafila.model.arch import (
    LEADING_COUNT_KEYS,
    PER_LAYER_KEYS,
    RESTORE_INPUT_KEY,
    NoWindowStage,
    require_supported,
)
from kafila.model.describe import BLOCK_TENSOR, ModelInfo, describe_file
from kafila.model.gguf_file import TensorInfo
from kafila.model.gguf_set import GGUFSet

Progress = Callable[[int, int], None]  # (bytes written, total bytes)

# The smallest vocabulary llama.cpp's gpt2 loader accepts: it refuses an empty merges list. The
# loader also sets attributes on tokens it looks up by the model's name ("phi3": <unk>, <s>,
# <|endoftext|>, </s>), and a body stage keeps the name, so those tokens must exist.
STUB_TOKENS = ["a", "b", "ab", "<unk>", "<s>", "<|endoftext|>", "</s>"]
STUB_MERGES = ["a b"]
STUB_VOCAB = len(STUB_TOKENS)


@dataclass(frozen=True)
class StageSpec:
    """Which blocks a stage holds, and whether it is the head (real tokenizer and output head)."""

    start: int
    end: int
    head: bool

    @property
    def tag(self) -> str:
        return f"{'head' if self.head else 'body'}-{self.start}-{self.end}"


def _check_range(spec: StageSpec, n_blocks: int) -> None:
    if not 0 <= spec.start < spec.end <= n_blocks:
        raise ModelError(
            f"block range [{spec.start}, {spec.end}) is outside the model's {n_blocks} blocks "
            f"(a range needs 0 <= start < end <= {n_blocks})"
        )


def _stage_overrides(
    gf: GGUFSet, info: ModelInfo, spec: StageSpec
) -> tuple[dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]], set[str]]:
    """Metadata the stage must hold instead of the source's (name → value, type, array type), and keys to drop."""
    arch, n = info.arch, spec.end - spec.start
    u32, arr = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY
    overrides: dict[str, tuple[object, gguf.GGUFValueType, gguf.GGUFValueType | None]] = {
        f"{arch}.block_count": (n, u32, None),
    }
    drop: set[str] = set()
    for suffix in PER_LAYER_KEYS:
        field = gf.fields.get(f"{arch}.{suffix}")
        if field is not None and field.type == arr and len(field.value) == info.n_blocks:
            overrides[f"{arch}.{suffix}"] = (field.plain()[spec.start:spec.end], arr, field.sub_type)
    for suffix in LEADING_COUNT_KEYS:
        key = f"{arch}.{suffix}"
        if key in gf.fields:
            leading = gf.get_int(key, 0)
            overrides[key] = (max(0, min(spec.end, leading) - spec.start), u32, None)
    profile = require_supported(arch)
    if profile.restore_input and spec.start > 0:  # the first stage scales its input as the whole model does
        overrides[RESTORE_INPUT_KEY] = (profile.restore_input, gguf.GGUFValueType.STRING, None)
    if info.window_layers:
        window = list(info.window_layers[spec.start:spec.end])
        if any(window):
            overrides[f"{arch}.attention.sliding_window_pattern"] = (window, arr, gguf.GGUFValueType.BOOL)
        elif profile.no_window_stage is NoWindowStage.PLAIN:
            # All layers global: without the window keys llama.cpp builds the arch's plain graph.
            drop |= {f"{arch}.attention.sliding_window", f"{arch}.attention.sliding_window_pattern"}
    for name in drop:
        overrides.pop(name, None)  # a pattern array sliced above must not come back
    return overrides, drop


def _copy_metadata(gf: GGUFSet, writer: gguf.GGUFWriter, info: ModelInfo, spec: StageSpec) -> None:
    arch = info.arch
    overrides, drop = _stage_overrides(gf, info, spec)
    for name, field in gf.fields.items():
        if name == gguf.Keys.General.ARCHITECTURE or name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        if not spec.head and (name.startswith("tokenizer.") or name == f"{arch}.vocab_size"):
            continue  # replaced by the stub below
        if name in drop:
            continue
        if name in overrides:
            value, vtype, sub = overrides.pop(name)
            writer.add_key_value(name, value, vtype, sub_type=sub)
            continue
        writer.add_key_value(name, field.plain(), field.type, sub_type=field.sub_type)
    for name, (value, vtype, sub) in overrides.items():
        writer.add_key_value(name, value, vtype, sub_type=sub)
    if not spec.head:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(STUB_TOKENS)
        writer.add_token_types([gguf.TokenType.NORMAL] * (STUB_VOCAB - 1) + [gguf.TokenType.CONTROL])
        writer.add_token_merges(STUB_MERGES)
        writer.add_bos_token_id(STUB_VOCAB - 1)
        writer.add_eos_token_id(STUB_VOCAB - 1)
        writer.add_uint32(f"{arch}.vocab_size", STUB_VOCAB)


def reads_source(name: str, spec: StageSpec) -> bool:
    """Whether cutting `spec` reads this source tensor's bytes: its own blocks', and every global tensor's but
    token_embd's and output's on a body stage (stubbed or left out). A model arriving chunk by chunk needs only
    these (and the header) before its stage can be cut."""
    m = BLOCK_TENSOR.match(name)
    if m:
        return spec.start <= int(m.group(1)) < spec.end
    return spec.head or name not in ("token_embd.weight", "output.weight")


def source_ranges(tensors: Iterable[TensorInfo], spec: StageSpec) -> list[tuple[int, int]]:
    """[start, end) byte ranges of the source file that cutting `spec` reads besides its header."""
    return [(t.offset, t.offset + t.n_bytes) for t in tensors if reads_source(t.name, spec)]


def _stage_tensors(
    gf: GGUFSet, spec: StageSpec, info: ModelInfo
) -> list[tuple[str, np.ndarray, gguf.GGMLQuantizationType]]:
    """(new name, raw bytes, tensor type) for every tensor of the stage, in the source file's order."""
    n_embd = info.n_embd
    stub_output = require_supported(info.arch).body_needs_output and not spec.head
    out = []
    for t in gf.tensors.values():
        if not reads_source(t.name, spec):  # only what reads_source names is read: see source_ranges
            if t.name == "token_embd.weight" or (t.name == "output.weight" and stub_output):
                stub = np.zeros((STUB_VOCAB, n_embd), np.float32).view(np.uint8)
                out.append((t.name, stub, gguf.GGMLQuantizationType.F32))
            continue  # another stage's block; a body stage's output head
        m = BLOCK_TENSOR.match(t.name)
        name = f"blk.{int(m.group(1)) - spec.start}.{m.group(2)}" if m else t.name  # output_norm, rope_freqs, ...
        out.append((name, gf.tensor_bytes(t), t.type))
    return out


PIECE = 8 << 20  # bytes written between two progress calls: a stop reaches a cut within one piece


class _Written:
    """Bytes of tensor data written so far, told to `progress` (which may raise to stop the cut)."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.done, self.total, self.progress = 0, total, progress

    def add(self, n: int) -> None:
        self.done += n
        self.check()

    def check(self) -> None:
        if self.progress:
            self.progress(self.done, self.total)


class _InPieces:
    """A tensor's raw bytes that GGUFWriter.write_tensor_data writes in PIECE-sized writes (it uses only
    `nbytes` and `tofile`): one real tensor (an 8B model's token_embd) is over a gigabyte, seconds of writing."""

    def __init__(self, data: np.ndarray, written: _Written) -> None:
        self.flat, self.written = data.reshape(-1).view(np.uint8), written
        self.nbytes = int(data.nbytes)

    def tofile(self, f: BinaryIO) -> None:
        for start in range(0, self.nbytes, PIECE):
            piece = self.flat[start:start + PIECE]
            f.write(piece.data)
            self.written.add(len(piece))


def write_stage(source: str | Path, spec: StageSpec, dest: str | Path, progress: Progress | None = None) -> Path:
    """Write the stage GGUF for `spec` to `dest` atomically (temp file, fsync, rename)."""
    gf = GGUFSet(source)
    info = describe_file(gf)
    _check_range(spec, info.n_blocks)
    problem = info.stage_problem(spec.start, spec.end)
    if problem:
        raise ModelError(problem)  # before anything is written: llama.cpp would abort or compute differently
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, info.arch)
    alignment = gf.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment)
    try:
        _copy_metadata(gf, writer, info, spec)
        tensors = _stage_tensors(gf, spec, info)
        for name, data, ttype in tensors:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total = sum(int(d.nbytes) for _, d, _ in tensors)
        written = _Written(total, progress)
        for _, data, _ in tensors:
            writer.write_tensor_data(_InPieces(data, written))  # type: ignore[arg-type]  # it reads nbytes, tofile
        writer.close()
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        written.check()  # a stop that came while closing still leaves no file
        os.replace(tmp, dest)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return dest

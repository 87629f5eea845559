"""What the planner and engine need to know about a model, read from its GGUF."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gguf

from kafila.errors import ModelError
from kafila.model.arch import ArchProfile, NoWindowStage, require_model_kind, require_supported, swa_pattern
from kafila.model.gguf_file import Metadata
from kafila.model.gguf_set import GGUFSet

# llama.cpp's default KV cache type is f16.
KV_BYTES_PER_ELEMENT = 2
# group 1: block index (as llama.cpp writes it: ASCII, no leading zero), group 2: the tensor within it (any
# byte: a damaged name is still the block's weight, and llama.cpp refuses it by name when it loads)
BLOCK_TENSOR = re.compile(r"^blk\.(0|[1-9][0-9]*)\.(.+)$", re.DOTALL)
# Routed experts, stacked along the last axis (ffn_gate_exps, ffn_up_exps, ffn_down_exps and their biases);
# shared experts (`_shexp`) and the router (`ffn_gate_inp`) are read by every token, like dense tensors.
EXPERT_TENSOR = re.compile(r"^ffn_(gate|up|down|gate_up)_exps\.(weight|bias)$")


@dataclass(frozen=True)
class ModelInfo:
    """Sizes and shapes of one GGUF model; bytes are as stored (quantised), per block where it matters."""

    path: Path
    name: str
    arch: str
    quant: str
    n_blocks: int
    n_embd: int
    n_head: int
    context_length: int
    vocab_size: int
    blocks_bytes: tuple[int, ...]  # weight bytes of blk.i.*
    kv_bytes_per_token: tuple[int, ...]  # K+V cache bytes per token of block i
    unembed_bytes: int  # output matrix, read once per sampled token
    head_bytes: int  # embedding + unembedding + output norm, resident on the head (once if tied)
    tied_output: bool
    file_bytes: int
    # llama.cpp's per-layer sliding-window flags for the whole model; empty when it has no window.
    window_layers: tuple[bool, ...] = ()
    window_tokens: int = 0  # the sliding window's length in tokens (0: none)
    experts: int = 0  # routed experts per block (0: dense)
    experts_used: int = 0  # routed experts each token uses
    expert_bytes: tuple[int, ...] = ()  # per block: one routed expert's bytes (empty: dense)
    expert_type: str = ""  # the routed experts' weight type, e.g. "MXFP4" (most of their bytes; "" dense)
    attention_width: int = 0  # attention heads × (key + value length): attention work per row and key position
    # the last block's ffn_* tensors: llama.cpp's last layer computes its FFN only for the rows that return logits
    last_ffn_bytes: int = 0

    @property
    def kv_window(self) -> tuple[int, ...]:
        """Per block: the tokens of KV cache a sliding-window layer keeps (0: the whole context)."""
        if not self.window_tokens:
            return ()
        return tuple(self.window_tokens if w else 0 for w in self.window_layers)

    @property
    def whole_only(self) -> bool:
        """True when no cut of this model is valid (see stage_problem)."""
        return self.n_blocks in require_supported(self.arch).whole_only_block_counts

    @property
    def must_hold(self) -> tuple[bool, ...]:
        """The planner's cut rule: when non-empty, every stage must hold one block flagged True (see stage_problem)."""
        if self.window_layers and require_supported(self.arch).no_window_stage is NoWindowStage.REFUSE:
            return self.window_layers
        return ()

    def stage_problem(self, start: int, end: int) -> str | None:
        """Why blocks [start, end) cannot be a stage of this model (llama.cpp would abort or differ), or None."""
        profile = require_supported(self.arch)
        if (end - start) != self.n_blocks and self.n_blocks in profile.whole_only_block_counts:
            return (f"{self.arch} with {self.n_blocks} blocks cannot be cut: llama.cpp picks its attention "
                    f"scale by block count, so a stage of fewer blocks would compute differently")
        if (self.window_layers and not any(self.window_layers[start:end])
                and profile.no_window_stage is NoWindowStage.REFUSE):
            return (f"blocks [{start}, {end}) of {self.arch} hold no sliding-window layer, and llama.cpp "
                    f"aborts on such a stage (it asserts is_swa_any()): put a window layer in every stage")
        return None

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready form (the planner's model-file schema plus descriptive fields)."""
        return {
            "name": self.name,
            "arch": self.arch,
            "quant": self.quant,
            "n_blocks": self.n_blocks,
            "n_embd": self.n_embd,
            "n_head": self.n_head,
            "context_length": self.context_length,
            "vocab_size": self.vocab_size,
            "tied_output": self.tied_output,
            "file_bytes": self.file_bytes,
            "blocks_bytes": list(self.blocks_bytes),
            "kv_bytes_per_token": list(self.kv_bytes_per_token),
            "unembed_bytes": self.unembed_bytes,
            "head_bytes": self.head_bytes,
            # per block, true where llama.cpp attends within a sliding window (empty: no window)
            "sliding_window_layers": list(self.window_layers),
            "sliding_window_tokens": self.window_tokens,
            "kv_window": list(self.kv_window),
            "experts": self.experts,
            "experts_used": self.experts_used,
            "expert_bytes": list(self.expert_bytes),
            "expert_type": self.expert_type,
            "attention_width": self.attention_width,
            "last_ffn_bytes": self.last_ffn_bytes,
            "whole_only": self.whole_only,
            "must_hold": list(self.must_hold),
        }


def describe_file(gf: GGUFSet) -> ModelInfo:
    """ModelInfo from a parsed GGUF or split set (see describe_model)."""
    path = gf.path
    require_model_kind(gf.get("general.type"))
    arch = str(gf.require("general.architecture"))
    profile = require_supported(arch)
    n_blocks = gf.get_int(f"{arch}.block_count", low=1)
    if n_blocks > len(gf.tensors):  # each block has tensors: a count past them is damage, not a model
        raise ModelError(f"{path.name} declares {n_blocks} blocks but holds only {len(gf.tensors)} tensors")
    n_embd = gf.get_int(f"{arch}.embedding_length", low=1)
    n_head = gf.get_int(f"{arch}.attention.head_count", low=1)
    n_head_kv = gf.get_per_layer(f"{arch}.attention.head_count_kv", n_blocks, n_head)
    head_dim = n_embd // n_head
    key_len = gf.get_int(f"{arch}.attention.key_length", head_dim)
    value_len = gf.get_int(f"{arch}.attention.value_length", head_dim)

    tensors = gf.tensors
    blocks = [0] * n_blocks
    experts_bytes = [0] * n_blocks  # all routed experts of the block
    expert_types: dict[gguf.GGMLQuantizationType, int] = {}  # bytes of routed-expert weights of each type
    last_ffn = 0
    for t in tensors.values():
        m = BLOCK_TENSOR.match(t.name)
        if m:
            i = int(m.group(1))
            if i >= n_blocks:
                raise ModelError(f"tensor {t.name} is outside the {n_blocks} blocks the metadata declares")
            blocks[i] += int(t.n_bytes)
            if EXPERT_TENSOR.match(m.group(2)):
                experts_bytes[i] += int(t.n_bytes)
                expert_types[t.type] = expert_types.get(t.type, 0) + int(t.n_bytes)
            if i == n_blocks - 1 and m.group(2).startswith("ffn_"):
                last_ffn += int(t.n_bytes)
    n_expert = gf.get_int(f"{arch}.expert_count", 0) if any(experts_bytes) else 0
    n_used = max(gf.get_per_layer(f"{arch}.expert_used_count", n_blocks, 0)) if n_expert else 0
    if n_expert and not 1 <= n_used <= n_expert:
        raise ModelError(f"{path.name}: {arch}.expert_used_count must be between 1 and expert_count ({n_expert})")
    for i, b in enumerate(blocks):
        if b == 0:
            raise ModelError(f"block {i} has no tensors")
    for required in ("token_embd.weight", "output_norm.weight"):
        if required not in tensors:
            raise ModelError(f"tensor {required} is missing")

    embd = tensors["token_embd.weight"]
    vocab = gf.get_int(f"{arch}.vocab_size", embd.ne[-1])
    output = tensors.get("output.weight")
    tied = output is None
    unembed = int((embd if tied else output).n_bytes)  # type: ignore[union-attr]
    head = int(embd.n_bytes) + (0 if tied else unembed) + int(tensors["output_norm.weight"].n_bytes)
    windows = window_layers(gf, arch, profile, n_blocks)
    return ModelInfo(
        path=path,
        name=str(gf.get("general.name", path.stem)),
        arch=arch,
        quant=quant_name(gf),
        n_blocks=n_blocks,
        n_embd=n_embd,
        n_head=n_head,
        context_length=gf.get_int(f"{arch}.context_length", 0),
        vocab_size=vocab,
        blocks_bytes=tuple(blocks),
        kv_bytes_per_token=tuple(h * (key_len + value_len) * KV_BYTES_PER_ELEMENT for h in n_head_kv),
        unembed_bytes=unembed,
        head_bytes=head,
        tied_output=tied,
        file_bytes=gf.file_bytes,
        window_layers=tuple(windows or ()),
        window_tokens=gf.get_int(f"{arch}.attention.sliding_window", 0) if windows else 0,
        experts=n_expert,
        experts_used=n_used,
        expert_bytes=tuple(e // n_expert for e in experts_bytes) if n_expert else (),
        expert_type=max(expert_types, key=expert_types.__getitem__).name if n_expert else "",
        attention_width=n_head * (key_len + value_len),
        last_ffn_bytes=last_ffn,
    )


def quant_name(gf: Metadata) -> str:
    """The quantisation named by general.file_type (e.g. Q4_K_M), or "unknown"."""
    try:
        return gguf.LlamaFileType(gf.get("general.file_type")).name.removeprefix("MOSTLY_")
    except ValueError:
        return "unknown"


def window_layers(gf: Metadata, arch: str, profile: ArchProfile, n_blocks: int) -> list[bool] | None:
    """The whole model's sliding-window flag per layer, read as llama.cpp's load_swa_pattern reads it."""
    if not profile.swa_period:
        return None
    if profile.swa_needs_key and gf.get_int(f"{arch}.attention.sliding_window", 0) <= 0:
        return None
    key = f"{arch}.attention.sliding_window_pattern"
    field = gf.fields.get(key)
    if field is not None and field.type == gguf.GGUFValueType.ARRAY:
        values = list(field.plain())
        if len(values) != n_blocks:
            raise ModelError(f"{gf.path.name}: GGUF metadata key '{key}' must hold {n_blocks} flags, one per block")
        return [bool(v) for v in values]
    return swa_pattern(profile, n_blocks, gf.get_int(key, profile.swa_period))


def describe_model(path: str | Path) -> ModelInfo:
    """Read a GGUF (the first file of a split set) and describe it; unsupported or corrupt ones raise ModelError."""
    return describe_file(GGUFSet(path))


@dataclass(frozen=True)
class Assessment:
    """What a listing shows of a model file: what it is and whether Kafila can split it (else why not)."""

    arch: str
    quant: str
    file_bytes: int
    problem: str  # "" when Kafila can split it


def assess_model(path: str | Path) -> Assessment:
    """Read a GGUF (or split set) far enough to say what it is and whether some cut of it is possible."""
    try:
        gf = GGUFSet(path)
    except ModelError as exc:
        return Assessment("?", "?", _size(Path(path)), str(exc))
    arch, quant, size = str(gf.get("general.architecture", "?")), quant_name(gf), gf.file_bytes
    try:
        info = describe_file(gf)
    except ModelError as exc:
        return Assessment(arch, quant, size, str(exc))
    n = info.n_blocks
    cuts = [info.stage_problem(0, k) or info.stage_problem(k, n) for k in range(1, n)]
    if cuts and all(cuts):  # no cut in two works (a model of one block runs whole, which it may)
        return Assessment(arch, quant, size, str(cuts[0]))
    return Assessment(arch, quant, size, "")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

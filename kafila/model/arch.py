"""Architectures Kafila can split, as data: one profile per architecture says what cutting it needs.

What breaks when a model is cut is whatever llama.cpp derives from a block's absolute index or
applies at the graph's input (DESIGN §2b). A profile names those things; `cut.py` and the head's
embedder act on them. Adding an architecture is a row here plus its test model in tests/synthetic.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kafila.errors import ModelError


class NoWindowStage(Enum):
    """What a stage whose blocks are all global (no sliding-window layer) must do."""

    PLAIN = "plain"  # drop the window keys: llama.cpp then builds the arch's non-SWA graph
    REFUSE = "refuse"  # llama.cpp always builds the SWA cache and asserts is_swa_any(): no such cut


@dataclass(frozen=True)
class ArchProfile:
    """What the cutter and the head must do for one architecture (its GGUF `general.architecture`)."""

    name: str
    # Sliding window: llama.cpp's `load_swa_pattern(ml, period, dense_first)` default for the arch;
    # 0 when it has no sliding-window layers. The cutter writes the stage's slice as a bool array.
    swa_period: int = 0
    swa_dense_first: bool = False
    # True when llama.cpp enables the window only if `<arch>.attention.sliding_window` > 0 (Gemma 3).
    swa_needs_key: bool = False
    no_window_stage: NoWindowStage = NoWindowStage.PLAIN
    # The head multiplies its dequantised embedding rows by sqrt(n_embd) in float32 (Gemma 3 skips
    # this scale in the graph when the batch carries embeddings, so the head must do it).
    embed_scale_sqrt: bool = False
    # The loader requires output.weight even in a body stage (gpt-oss): body stages get a stub.
    body_needs_output: bool = False
    # A graph node computed from the input unconditionally (Gemma 1/2 scale it by sqrt(n_embd)):
    # every stage but the first overwrites it with its own input rows in the eval callback.
    restore_input: str = ""
    # Block counts at which llama.cpp picks different arithmetic by model size (e.g. the attention
    # scale of Gemma 2/3 27B): such a model can run only whole, since a stage has another count.
    whole_only_block_counts: tuple[int, ...] = ()


SUPPORTED: dict[str, ArchProfile] = {
    p.name: p
    for p in (
        ArchProfile("llama"),  # Llama 3.1+ rope_freqs is a global tensor: copied to every stage
        ArchProfile("qwen2"),
        ArchProfile("qwen3"),
        ArchProfile("qwen3moe"),  # experts live inside blocks; expert FFN length may be per layer
        ArchProfile("phi3"),  # llama.cpp disables Phi-3's window ("Phi SWA is currently disabled")
        ArchProfile("gemma3", swa_period=6, swa_needs_key=True, embed_scale_sqrt=True,
                    whole_only_block_counts=(62,)),
        ArchProfile("gpt-oss", swa_period=2, no_window_stage=NoWindowStage.REFUSE, body_needs_output=True),
        ArchProfile("gemma2", swa_period=2, no_window_stage=NoWindowStage.REFUSE, restore_input="inp_scaled",
                    whole_only_block_counts=(46,)),
        ArchProfile("gemma", restore_input="inp_scaled"),
    )
}

# Stage metadata: the graph node a stage's engine restores to its input rows (see restore_input).
RESTORE_INPUT_KEY = "kafila.restore_input"

# Keys llama.cpp reads with get_key_or_arr / get_arr over n_layer: an array of n_blocks is per layer
# and gets sliced to the stage's range. Suffixes after "<arch>.".
PER_LAYER_KEYS: tuple[str, ...] = (
    "attention.head_count",
    "attention.head_count_kv",
    "feed_forward_length",
    "expert_feed_forward_length",
    "expert_used_count",
    "swiglu_clamp_exp",
    "swiglu_clamp_shexp",
    "attention.sliding_window_pattern",
)
# Counts of leading blocks that differ (dense FFN before MoE ones): shifted by the stage's start.
LEADING_COUNT_KEYS: tuple[str, ...] = ("leading_dense_block_count",)

_RECURRENT = ("keeps a per-sequence recurrent state instead of a per-position KV cache, "
              "which a stage cut cannot carry yet")
REFUSED: dict[str, str] = {
    **{a: f"a recurrent model {_RECURRENT}" for a in ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")},
    **{a: f"a hybrid model (attention plus recurrent layers) {_RECURRENT}" for a in (
        "qwen3next", "qwen35", "qwen35moe", "lfm2", "lfm2moe", "jamba", "falcon-h1", "nemotron_h",
        "nemotron_h_moe", "granitehybrid", "plamo2", "kimi-linear")},
    **{a: "an encoder-decoder: its decoder attends to the encoder's output, not a ring of blocks"
       for a in ("t5", "t5encoder")},
    **{a: "an encoder (embedding model), not a text generator" for a in (
        "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3",
        "eurobert", "gemma-embedding")},
    **{a: "a diffusion language model: it denoises a whole sequence at once, not one token after another"
       for a in ("dream", "llada", "llada-moe")},
    "clip": "a multimodal projector file (mmproj), not a language model: pass the model GGUF itself",
}

# What a GGUF's general.type says it is, when that is not a model to run ("model" or absent is one).
REFUSED_KINDS: dict[str, str] = {
    "mmproj": "a multimodal projector file (mmproj), not a language model: pass the model GGUF itself",
    "adapter": "a LoRA adapter, not a model: pass the base model GGUF",
}


def require_model_kind(kind: object) -> None:
    """A ModelError when general.type (`kind`) says the file is not a model, such as a projector or adapter."""
    reason = REFUSED_KINDS.get(str(kind)) if kind is not None else None
    if reason:
        raise ModelError(f"this GGUF cannot be split: it is {reason}")


def require_supported(arch: str) -> ArchProfile:
    """The profile for `arch`, or a ModelError naming it and why (or what is supported)."""
    try:
        return SUPPORTED[arch]
    except KeyError:
        reason = REFUSED.get(arch)
        if reason:
            raise ModelError(f"architecture '{arch}' cannot be split: {reason}") from None
        raise ModelError(
            f"unsupported architecture '{arch}': Kafila can split {', '.join(sorted(SUPPORTED))}"
        ) from None


def swa_pattern(profile: ArchProfile, n_blocks: int, period: int | None = None) -> list[bool] | None:
    """The whole model's per-layer sliding-window flags as llama.cpp sets them, or None without a window."""
    period = profile.swa_period if period is None else period
    if not profile.swa_period:
        return None
    if profile.swa_dense_first:
        return [period == 0 or il % period != 0 for il in range(n_blocks)]
    return [period == 0 or il % period < period - 1 for il in range(n_blocks)]

"""Architectures Kafila can split, and the per-architecture facts the model layer needs."""

from __future__ import annotations

from dataclasses import dataclass

from kafila.errors import ModelError


@dataclass(frozen=True)
class ArchSupport:
    """What differs between supported architectures, as far as stage cutting is concerned."""

    name: str
    # Tensors a block may have beyond the llama set; all blk.N.* tensors are copied anyway,
    # so this only documents what the synthetic test models must include.
    extra_block_tensors: tuple[str, ...] = ()


SUPPORTED: dict[str, ArchSupport] = {
    "llama": ArchSupport("llama"),
    "qwen2": ArchSupport("qwen2", ("attn_q.bias", "attn_k.bias", "attn_v.bias")),
    "qwen3": ArchSupport("qwen3", ("attn_q_norm.weight", "attn_k_norm.weight")),
}


def require_supported(arch: str) -> ArchSupport:
    """The support entry for `arch`, or a ModelError naming it and what is supported."""
    try:
        return SUPPORTED[arch]
    except KeyError:
        raise ModelError(
            f"unsupported architecture '{arch}': Kafila can split {', '.join(sorted(SUPPORTED))}"
        ) from None

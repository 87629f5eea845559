"""What the planner is given: members, the model and the workload, as frozen dataclasses in SI units."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from kafila.errors import PlanInputError
from kafila.planner.reachability import NatClass


@dataclass(frozen=True)
class Member:
    """One machine as its probe measured it."""

    name: str
    bandwidth: float  # bytes per second it streams weights at (b_i)
    dispatch_s: float  # fixed overhead of one stage call, seconds (o_i)
    memory: int  # bytes it can give to weights and KV cache (M_i)
    rtt_ms: float  # round-trip time to the rendezvous, milliseconds (r_i)
    nat: NatClass = NatClass.UNKNOWN
    # bytes per second the head's unembedding streams at (its own quantisation and shape make it run at
    # another speed than the blocks); None: the blocks' bandwidth
    unembed_bandwidth: float | None = None


class DescribedModel(Protocol):
    """What the model layer's description of a GGUF offers the planner (kafila.model.describe.ModelInfo)."""

    @property
    def name(self) -> str: ...
    @property
    def blocks_bytes(self) -> tuple[int, ...]: ...
    @property
    def kv_bytes_per_token(self) -> tuple[int, ...]: ...
    @property
    def unembed_bytes(self) -> int: ...
    @property
    def head_bytes(self) -> int: ...
    @property
    def quant(self) -> str: ...


@dataclass(frozen=True)
class ModelSpec:
    """Sizes the planner needs; bytes as stored, i.e. quantised."""

    name: str
    blocks_bytes: tuple[int, ...]  # s_j, weight bytes of block j
    kv_bytes_per_token: tuple[int, ...]  # kv_j, K+V cache bytes per token of block j
    unembed_bytes: int  # U, read once per sampled token by the head
    head_bytes: int  # H, resident on the head (embedding + unembedding, once if tied)
    quant: str | None = None  # e.g. "Q4_K_M", only used to name smaller quantisations
    bits_per_weight: float | None = None  # average over the file, same use

    @property
    def k(self) -> int:
        """Number of blocks."""
        return len(self.blocks_bytes)

    def weight_bytes(self) -> int:
        """Every weight byte the ring holds: all blocks plus the head's tensors."""
        return sum(self.blocks_bytes) + self.head_bytes

    @classmethod
    def described(cls, info: DescribedModel) -> ModelSpec:
        """The planner's view of a described GGUF (a structural type: the planner imports no model code)."""
        return cls(info.name, tuple(info.blocks_bytes), tuple(info.kv_bytes_per_token), info.unembed_bytes,
                   info.head_bytes, quant=info.quant)


@dataclass(frozen=True)
class Workload:
    """What the session must admit: C concurrent requests of up to T tokens each."""

    concurrency: int = 1
    context: int = 4096

    @property
    def tokens(self) -> int:
        """C·T, the KV cache positions every block must hold."""
        return self.concurrency * self.context


def check_inputs(members: tuple[Member, ...], model: ModelSpec, workload: Workload) -> None:
    """Raise PlanInputError naming the field when the numbers cannot describe a real fleet or model."""
    if not members:
        raise PlanInputError("fleet: members is empty; a ring needs at least one member")
    seen: set[str] = set()
    for n, mem in enumerate(members, 1):
        where = f"fleet member {n} ({mem.name!r})"
        if not mem.name:
            raise PlanInputError(f"fleet member {n}: name must be a non-empty string")
        if mem.name in seen:
            raise PlanInputError(f"{where}: name is used by another member; names must be unique")
        seen.add(mem.name)
        if not (math.isfinite(mem.bandwidth) and mem.bandwidth > 0):
            raise PlanInputError(f"{where}: bandwidth must be > 0, got {mem.bandwidth}")
        if not (math.isfinite(mem.dispatch_s) and mem.dispatch_s >= 0):
            raise PlanInputError(f"{where}: dispatch time must be >= 0, got {mem.dispatch_s}")
        if mem.memory <= 0:
            raise PlanInputError(f"{where}: memory must be > 0, got {mem.memory}")
        if not (math.isfinite(mem.rtt_ms) and mem.rtt_ms >= 0):
            raise PlanInputError(f"{where}: rtt_ms must be >= 0, got {mem.rtt_ms}")
        ub = mem.unembed_bandwidth
        if ub is not None and not (math.isfinite(ub) and ub > 0):
            raise PlanInputError(f"{where}: unembedding bandwidth must be > 0, got {ub}")
    if model.k == 0:
        raise PlanInputError(f"model {model.name!r}: blocks_bytes is empty")
    if len(model.kv_bytes_per_token) != model.k:
        raise PlanInputError(
            f"model {model.name!r}: kv_bytes_per_token has {len(model.kv_bytes_per_token)} entries, "
            f"blocks_bytes has {model.k}"
        )
    if any(s <= 0 for s in model.blocks_bytes):
        raise PlanInputError(f"model {model.name!r}: every blocks_bytes entry must be > 0")
    if any(v < 0 for v in model.kv_bytes_per_token):
        raise PlanInputError(f"model {model.name!r}: every kv_bytes_per_token entry must be >= 0")
    if model.unembed_bytes < 0 or model.head_bytes < 0:
        raise PlanInputError(f"model {model.name!r}: unembed_bytes and head_bytes must be >= 0")
    if len(members) > model.k:
        raise PlanInputError(
            f"fleet members: {len(members)} members but model {model.name!r} has only {model.k} blocks "
            "(blocks_bytes); every member needs at least one block"
        )
    if workload.concurrency < 1 or workload.context < 1:
        raise PlanInputError(
            f"workload: concurrency and context must be >= 1, got {workload.concurrency} and {workload.context}"
        )

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
    unembed_s: float = 0.0  # fixed seconds of the head's unembedding besides its bytes (the probe's fit)
    # fixed seconds each block adds to a call besides its bytes (a few dozen ops, each a thread barrier:
    # DESIGN §2c); 0 for a fleet measured without it
    block_s: float = 0.0
    # a prefill call of `prefill_rows` rows costs prefill_dispatch_s + n·prefill_block_s + bytes/prefill_bandwidth
    # (the probe's own fit); prefill_rows 0: not measured, and the plan predicts no TTFT
    prefill_bandwidth: float = 0.0
    prefill_dispatch_s: float = 0.0
    prefill_block_s: float = 0.0
    prefill_rows: int = 0
    # seconds each row of a prefill call adds per earlier position of its sequence, per block and unit of
    # ModelSpec.attention_width (the probe's fit; 0: not measured, attention over the context left out)
    prefill_attn_s: float = 0.0
    # per expert weight type ("Q4_0", "MXFP4"): routed-expert bytes × experts used that a prefill call's rows
    # compute per second (mixture-of-experts blocks run them slower than dense matrices, and MXFP4 slower than
    # Q4_0: kafila.engine.probe.EXPERT_SHAPES); none: at prefill_bandwidth
    prefill_expert_rates: tuple[tuple[str, float], ...] = ()
    machine: str = ""  # members with the same non-empty id share one machine's cores ("" : a machine of its own)
    throttle: float = 1.0  # emulated slow-down already in the numbers above: 1/throttle of a call is compute

    def expert_rate(self, expert_type: str) -> float:
        """The routed-expert prefill rate for experts of `expert_type` (see `expert_rate`)."""
        return expert_rate(dict(self.prefill_expert_rates), expert_type, self.prefill_bandwidth)


def expert_rate(rates: dict[str, float], expert_type: str, dense: float) -> float:
    """The rate measured for `expert_type`, else for Q4_0 (the most common), else the dense prefill rate."""
    return rates.get(expert_type) or rates.get("Q4_0") or dense




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
    @property
    def expert_bytes(self) -> tuple[int, ...]: ...
    @property
    def experts(self) -> int: ...
    @property
    def experts_used(self) -> int: ...
    @property
    def expert_type(self) -> str: ...
    @property
    def kv_window(self) -> tuple[int, ...]: ...
    @property
    def attention_width(self) -> int: ...
    @property
    def last_ffn_bytes(self) -> int: ...
    @property
    def whole_only(self) -> bool: ...
    @property
    def must_hold(self) -> tuple[bool, ...]: ...


@dataclass(frozen=True)
class ModelSpec:
    """Sizes the planner needs; bytes as stored, i.e. quantised.

    Mixture-of-experts blocks: `blocks_bytes` counts every expert (all are resident); `expert_bytes[j]`
    is one routed expert's bytes in block j (0: a dense block), `experts` routed experts per block,
    `experts_used` of them per token. Sliding-window layers: `kv_window[j]` > 0 is block j's window in
    tokens (0: it attends to the whole context); its cache still holds the whole context (cost.kv_positions).
    Cut rules from the model layer (`ModelInfo.stage_problem`):
    `whole_only` forbids any cut; a non-empty `must_hold` means every stage holds a block flagged True.
    """

    name: str
    blocks_bytes: tuple[int, ...]  # s_j, weight bytes of block j
    kv_bytes_per_token: tuple[int, ...]  # kv_j, K+V cache bytes per token of block j
    unembed_bytes: int  # U, read once per sampled token by the head
    head_bytes: int  # H, resident on the head (embedding + unembedding, once if tied)
    quant: str | None = None  # e.g. "Q4_K_M", only used to name smaller quantisations
    bits_per_weight: float | None = None  # average over the file, same use
    expert_bytes: tuple[int, ...] = ()  # per block: one routed expert's bytes (empty or 0: dense)
    experts: int = 0  # routed experts per MoE block (n)
    experts_used: int = 0  # routed experts each token uses (k)
    expert_type: str = ""  # the routed experts' weight type, e.g. "MXFP4" (their prefill rate depends on it)
    kv_window: tuple[int, ...] = ()  # per block: sliding window in tokens (empty or 0: whole context)
    whole_only: bool = False  # llama.cpp computes differently on any cut: a one-member ring only
    must_hold: tuple[bool, ...] = ()  # every stage must hold at least one block flagged True
    # attention heads × (key + value length): a block's attention work per row and earlier position, in the
    # unit of Member.prefill_attn_s (0: unknown, attention over the context left out of TTFT)
    attention_width: int = 0
    # the last block's FFN weights, which a prefill chunk reads for its logit rows only (llama.cpp drops the other
    # rows before the last layer's FFN): the head's share of a prompt is smaller than its blocks' (0: unknown)
    last_ffn_bytes: int = 0

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
                   info.head_bytes, quant=info.quant, expert_bytes=tuple(info.expert_bytes),
                   experts=info.experts, experts_used=info.experts_used, expert_type=info.expert_type,
                   kv_window=tuple(info.kv_window),
                   whole_only=info.whole_only, must_hold=tuple(info.must_hold),
                   attention_width=info.attention_width, last_ffn_bytes=info.last_ffn_bytes)


@dataclass(frozen=True)
class Workload:
    """What the session must admit: C concurrent requests of up to T tokens each."""

    concurrency: int = 1
    context: int = 4096
    batch: int = 128  # most rows per stage call: a prompt goes round in chunks of this many tokens
    prompt_tokens: int = 2000  # the prompt length whose time to first token the plan predicts

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
        if not (math.isfinite(mem.block_s) and mem.block_s >= 0):
            raise PlanInputError(f"{where}: per-block time must be >= 0, got {mem.block_s}")
        prefill = (mem.prefill_bandwidth, mem.prefill_dispatch_s, mem.prefill_block_s,
                   *(rate for _, rate in mem.prefill_expert_rates))
        if not all(math.isfinite(v) and v >= 0 for v in prefill) or mem.prefill_rows < 0:
            raise PlanInputError(f"{where}: prefill numbers must be >= 0, got {prefill} at {mem.prefill_rows} rows")
        if mem.prefill_rows and mem.prefill_bandwidth <= 0:
            raise PlanInputError(f"{where}: prefill bandwidth must be > 0 when prefill was measured")
        if not (math.isfinite(mem.throttle) and mem.throttle >= 1):
            raise PlanInputError(f"{where}: throttle must be >= 1, got {mem.throttle}")
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
    _check_moe_and_cuts(model, len(members))
    if len(members) > model.k:
        raise PlanInputError(
            f"fleet members: {len(members)} members but model {model.name!r} has only {model.k} blocks "
            "(blocks_bytes); every member needs at least one block"
        )
    if workload.concurrency < 1 or workload.context < 1:
        raise PlanInputError(
            f"workload: concurrency and context must be >= 1, got {workload.concurrency} and {workload.context}"
        )
    if workload.batch < 1 or workload.prompt_tokens < 1:
        raise PlanInputError(
            f"workload: batch and prompt_tokens must be >= 1, got {workload.batch} and {workload.prompt_tokens}"
        )


def _check_moe_and_cuts(model: ModelSpec, m: int) -> None:
    """The MoE, window and cut-rule fields: lengths match the blocks, counts make sense, the rule admits m stages."""
    where = f"model {model.name!r}"
    for key, values in (("expert_bytes", model.expert_bytes), ("kv_window", model.kv_window),
                        ("must_hold", model.must_hold)):
        if values and len(values) != model.k:
            raise PlanInputError(f"{where}: {key} has {len(values)} entries, blocks_bytes has {model.k}")
    if any(v < 0 for v in (*model.expert_bytes, *model.kv_window)):
        raise PlanInputError(f"{where}: expert_bytes and kv_window entries must be >= 0")
    if any(model.expert_bytes):
        if not 1 <= model.experts_used <= model.experts:
            raise PlanInputError(f"{where}: experts_used must be between 1 and experts ({model.experts}), "
                                 f"got {model.experts_used}")
        for j, (s, x) in enumerate(zip(model.blocks_bytes, model.expert_bytes, strict=False)):
            if x * model.experts > s:
                raise PlanInputError(f"{where}: block {j} holds {s} bytes, less than its {model.experts} "
                                     f"experts of {x} bytes")
    if m > 1 and model.whole_only:
        raise PlanInputError(f"{where} can run only whole (llama.cpp computes a cut of it differently): "
                             f"a ring of {m} members cannot hold it; use one member")
    if model.must_hold and sum(model.must_hold) < m:
        raise PlanInputError(f"{where}: every stage must hold one of its {sum(model.must_hold)} sliding-window "
                             f"blocks (llama.cpp aborts otherwise), so at most {sum(model.must_hold)} members "
                             f"can share it; the fleet has {m}")

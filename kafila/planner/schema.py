"""Fleet and model JSON objects (issue 3's file formats) to planner inputs, with errors that name the field.

Fleet: {"members": [{"name", "bandwidth_gbs", "dispatch_ms", "memory_gb", "rtt_ms", "nat"}, …]},
each optionally with "unembed_bandwidth_gbs" (GB are 1e9 bytes) and "unembed_ms" (the unembedding's fixed
time), "block_ms" (fixed time per block), the
prefill fit "prefill_bandwidth_gbs", "prefill_dispatch_ms", "prefill_block_ms" at "prefill_rows" rows per call,
"prefill_attention_s" (seconds per row, earlier position and unit of the model's attention width),
"prefill_expert_bandwidth_gbs" ({expert weight type: routed-expert bytes × experts used that prefill rows
compute per second}),
"machine" (members naming the same machine share its cores) and "throttle" (an emulated slow-down >= 1).
Model: {"name", "blocks_bytes", "kv_bytes_per_token", "unembed_bytes", "head_bytes"}, optionally "quant",
"bits_per_weight", MoE "expert_bytes" (one routed expert per block), "experts", "experts_used", "expert_type",
"kv_window" (per block, 0: whole context), "attention_width" (heads × (key + value length)), "last_ffn_bytes"
(the last block's FFN weights), "whole_only" and "must_hold" (cut rules). Unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
from typing import Any

from kafila.errors import PlanInputError
from kafila.planner.reachability import NatClass
from kafila.planner.spec import Member, ModelSpec

_NATS = ", ".join(c.value for c in NatClass)


def _number(obj: dict[str, Any], key: str, where: str, minimum: float, strict: bool) -> float:
    if key not in obj:
        raise PlanInputError(f"{where}: missing field {key}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanInputError(f"{where}: {key} must be a number, got {value!r}")
    if (strict and value <= minimum) or (not strict and value < minimum):
        raise PlanInputError(f"{where}: {key} must be {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return float(value)


def _integer(obj: dict[str, Any], key: str, where: str) -> int:
    if key not in obj:
        raise PlanInputError(f"{where}: missing field {key}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanInputError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


def parse_fleet(data: Any) -> tuple[Member, ...]:
    """Members from a fleet JSON object; PlanInputError names the member and the field."""
    if not isinstance(data, dict) or "members" not in data:
        raise PlanInputError('fleet: expected an object with a "members" list')
    raw = data["members"]
    if not isinstance(raw, list):
        raise PlanInputError(f"fleet: members must be a list, got {type(raw).__name__}")
    if not raw:
        raise PlanInputError("fleet: members is empty; a ring needs at least one member")
    members: list[Member] = []
    names: set[str] = set()
    for n, item in enumerate(raw, 1):
        if not isinstance(item, dict):
            raise PlanInputError(f"fleet member {n}: expected an object, got {type(item).__name__}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise PlanInputError(f"fleet member {n}: name must be a non-empty string, got {name!r}")
        where = f"fleet member {n} ({json.dumps(name)})"
        if name in names:
            raise PlanInputError(f"{where}: name is used by another member; names must be unique")
        names.add(name)
        bandwidth = _number(item, "bandwidth_gbs", where, 0, strict=True)
        dispatch = _number(item, "dispatch_ms", where, 0, strict=False)
        memory = _number(item, "memory_gb", where, 0, strict=True)
        rtt = _number(item, "rtt_ms", where, 0, strict=False)
        ub = _number(item, "unembed_bandwidth_gbs", where, 0, strict=True) if "unembed_bandwidth_gbs" in item else None
        block_ms = _number(item, "block_ms", where, 0, strict=False) if "block_ms" in item else 0.0
        unembed_ms = _number(item, "unembed_ms", where, 0, strict=False) if "unembed_ms" in item else 0.0
        prefill_rows = _integer(item, "prefill_rows", where) if "prefill_rows" in item else 0
        prefill = {key: _number(item, key, where, 0, strict=key == "prefill_bandwidth_gbs") if prefill_rows else 0.0
                   for key in ("prefill_bandwidth_gbs", "prefill_dispatch_ms", "prefill_block_ms")}
        attention = _number(item, "prefill_attention_s", where, 0, strict=False) if "prefill_attention_s" in item \
            else 0.0
        experts = _expert_rates(item.get("prefill_expert_bandwidth_gbs", {}), where)
        machine = item.get("machine", "")
        if not isinstance(machine, str):
            raise PlanInputError(f"{where}: machine must be a string, got {machine!r}")
        throttle = _number(item, "throttle", where, 1, strict=False) if "throttle" in item else 1.0
        if "nat" not in item:
            raise PlanInputError(f"{where}: missing field nat (one of {_NATS})")
        try:
            nat = NatClass(item["nat"])
        except ValueError:
            raise PlanInputError(f"{where}: nat must be one of {_NATS}, got {item['nat']!r}") from None
        members.append(
            Member(
                name=name,
                bandwidth=bandwidth * 1e9,
                dispatch_s=dispatch / 1000,
                memory=round(memory * 1e9),
                rtt_ms=rtt,
                nat=nat,
                unembed_bandwidth=None if ub is None else ub * 1e9,
                block_s=block_ms / 1000,
                unembed_s=unembed_ms / 1000,
                prefill_bandwidth=prefill["prefill_bandwidth_gbs"] * 1e9,
                prefill_dispatch_s=prefill["prefill_dispatch_ms"] / 1000,
                prefill_block_s=prefill["prefill_block_ms"] / 1000,
                prefill_rows=prefill_rows,
                prefill_attn_s=attention,
                prefill_expert_rates=experts,
                machine=machine,
                throttle=throttle,
            )
        )
    return tuple(members)


def parse_model(data: Any) -> ModelSpec:
    """A model spec from a model JSON object; PlanInputError names the field."""
    if not isinstance(data, dict):
        raise PlanInputError("model: expected a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise PlanInputError(f"model: name must be a non-empty string, got {name!r}")
    where = f'model "{name}"'
    lists: dict[str, tuple[int, ...]] = {}
    for key, positive in (("blocks_bytes", True), ("kv_bytes_per_token", False)):
        if key not in data:
            raise PlanInputError(f"{where}: missing field {key}")
        value = data[key]
        if not isinstance(value, list) or not value:
            raise PlanInputError(f"{where}: {key} must be a non-empty list of integers")
        for j, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if positive else 0):
                raise PlanInputError(
                    f"{where}: {key}[{j}] must be an integer {'> 0' if positive else '>= 0'}, got {v!r}"
                )
        lists[key] = tuple(value)
    if len(lists["kv_bytes_per_token"]) != len(lists["blocks_bytes"]):
        raise PlanInputError(
            f"{where}: kv_bytes_per_token has {len(lists['kv_bytes_per_token'])} entries, "
            f"blocks_bytes has {len(lists['blocks_bytes'])}"
        )
    for key in ("expert_bytes", "kv_window"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                  for v in value):
            raise PlanInputError(f"{where}: {key} must be a list of integers >= 0")
        lists[key] = tuple(value)
    must_hold = data.get("must_hold", [])
    if not isinstance(must_hold, list) or not all(isinstance(v, bool) for v in must_hold):
        raise PlanInputError(f"{where}: must_hold must be a list of true/false")
    whole_only = data.get("whole_only", False)
    if not isinstance(whole_only, bool):
        raise PlanInputError(f"{where}: whole_only must be true or false, got {whole_only!r}")
    experts = _integer(data, "experts", where) if "experts" in data else 0
    experts_used = _integer(data, "experts_used", where) if "experts_used" in data else 0
    expert_type = data.get("expert_type", "")
    if not isinstance(expert_type, str):
        raise PlanInputError(f"{where}: expert_type must be a string, got {expert_type!r}")
    quant = data.get("quant")
    bpw = data.get("bits_per_weight")
    if bpw is not None:
        bpw = _number(data, "bits_per_weight", where, 0, strict=True)
    return ModelSpec(
        name=name,
        blocks_bytes=lists["blocks_bytes"],
        kv_bytes_per_token=lists["kv_bytes_per_token"],
        unembed_bytes=_integer(data, "unembed_bytes", where),
        head_bytes=_integer(data, "head_bytes", where),
        quant=quant if isinstance(quant, str) else None,
        bits_per_weight=bpw,
        expert_bytes=lists["expert_bytes"],
        experts=experts,
        experts_used=experts_used,
        expert_type=expert_type,
        kv_window=lists["kv_window"],
        whole_only=whole_only,
        must_hold=tuple(must_hold),
        attention_width=_integer(data, "attention_width", where) if "attention_width" in data else 0,
        last_ffn_bytes=_last_ffn(data, lists["blocks_bytes"], where),
    )


def _expert_rates(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    """{"Q4_0": GB/s, "MXFP4": GB/s} as the member's (type, bytes/s) pairs."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int | float) and not
                                              isinstance(v, bool) and math.isfinite(v) and v > 0
                                              for k, v in value.items()):
        raise PlanInputError(f"{where}: prefill_expert_bandwidth_gbs must map expert weight types to GB/s > 0, "
                             f"got {value!r}")
    return tuple((k, float(v) * 1e9) for k, v in sorted(value.items()))


def _last_ffn(data: dict[str, Any], blocks: tuple[int, ...], where: str) -> int:
    value = _integer(data, "last_ffn_bytes", where) if "last_ffn_bytes" in data else 0
    if blocks and value > blocks[-1]:
        raise PlanInputError(f"{where}: last_ffn_bytes ({value}) exceeds the last block's bytes ({blocks[-1]})")
    return value


def model_to_json(model: ModelSpec) -> dict[str, Any]:
    """The model-file form of a spec (what `bench/` ships)."""
    out: dict[str, Any] = {
        "name": model.name,
        "blocks_bytes": list(model.blocks_bytes),
        "kv_bytes_per_token": list(model.kv_bytes_per_token),
        "unembed_bytes": model.unembed_bytes,
        "head_bytes": model.head_bytes,
    }
    if model.quant:
        out["quant"] = model.quant
    if model.bits_per_weight:
        out["bits_per_weight"] = model.bits_per_weight
    if any(model.expert_bytes):
        out.update(expert_bytes=list(model.expert_bytes), experts=model.experts, experts_used=model.experts_used)
        if model.expert_type:
            out["expert_type"] = model.expert_type
    if any(model.kv_window):
        out["kv_window"] = list(model.kv_window)
    if model.attention_width:
        out["attention_width"] = model.attention_width
    if model.last_ffn_bytes:
        out["last_ffn_bytes"] = model.last_ffn_bytes
    if model.whole_only:
        out["whole_only"] = True
    if model.must_hold:
        out["must_hold"] = list(model.must_hold)
    return out

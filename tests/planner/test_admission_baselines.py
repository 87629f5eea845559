"""Rejection reasons that admit when followed, the baselines' splits, and the stable JSON schema."""

from __future__ import annotations

import json

import pytest

from kafila.planner import Member, ModelSpec, NatClass, Workload, make_plan
from kafila.planner.admission import QUANT_BPW

pytestmark = pytest.mark.fast

GB = 10**9
# Eight 1 GB blocks with 10 kB of KV per token each; the head keeps 1 GB of embedding and unembedding.
MODEL = ModelSpec("eight", (GB,) * 8, (10**4,) * 8, unembed_bytes=GB // 2, head_bytes=GB, quant="Q4_K_M")


def fleet(*memories_gb: float) -> tuple[Member, ...]:
    return tuple(
        Member(f"m{i}", 100e9, 0.001, int(mem * GB), 10.0 + i, NatClass.ORDINARY) for i, mem in enumerate(memories_gb)
    )


def test_rejection_names_the_short_member_and_remedies_that_work() -> None:
    members = fleet(6.3, 3.3)
    workload = Workload(concurrency=16, context=1024)  # KV: 16 × 1024 × 10 kB ≈ 164 MB per block
    plan = make_plan(members, MODEL, workload)
    assert not plan.feasible and plan.head is None and plan.ranges == {}
    adm = plan.admission
    assert adm is not None
    assert adm.need_bytes == 8 * GB + 16 * 1024 * 8 * 10**4 + GB
    assert adm.have_bytes == int(9.6 * GB)
    assert adm.shortfalls and all(s.need > s.has for s in adm.shortfalls)
    assert "short by" in adm.text and adm.shortfalls[0].name in adm.text
    # Each remedy admits, and is the limit: one more does not.
    assert adm.max_concurrency == 5  # the head (5 blocks + 1 GB) in 6.3 GB: 5 × C × 10.24 MB ≤ 0.3 GB
    if adm.max_concurrency is not None:
        assert make_plan(members, MODEL, Workload(adm.max_concurrency, 1024)).feasible
        assert not make_plan(members, MODEL, Workload(adm.max_concurrency + 1, 1024)).feasible
    assert adm.max_context is not None
    assert make_plan(members, MODEL, Workload(16, adm.max_context)).feasible
    assert not make_plan(members, MODEL, Workload(16, adm.max_context + 1)).feasible
    assert "would admit" in adm.text and str(adm.max_context) in adm.text


def test_smaller_quantisation_suggested_when_weights_are_the_problem() -> None:
    members = fleet(3, 3, 2)  # 8 GB of blocks + 1 GB head, 8 GB of memory
    plan = make_plan(members, MODEL, Workload(1, 16))
    adm = plan.admission
    assert adm is not None and adm.max_weight_fraction is not None
    assert 0.5 < adm.max_weight_fraction < 1.0
    assert adm.max_concurrency is None  # concurrency 1 is already the least
    limit = QUANT_BPW["Q4_K_M"] * adm.max_weight_fraction
    assert adm.smaller_quants and all(QUANT_BPW[q] <= limit for q in adm.smaller_quants)
    assert "Q4_K_M" not in adm.smaller_quants
    scaled = ModelSpec(
        "smaller",
        tuple(int(b * adm.max_weight_fraction) for b in MODEL.blocks_bytes),
        MODEL.kv_bytes_per_token,
        int(MODEL.unembed_bytes * adm.max_weight_fraction),
        int(MODEL.head_bytes * adm.max_weight_fraction),
    )
    assert make_plan(members, scaled, Workload(1, 16)).feasible


def test_kv_cache_alone_too_big_says_no_quantisation_helps() -> None:
    plan = make_plan(fleet(2, 2), MODEL, Workload(1, 100_000))  # KV alone: 8 GB
    assert plan.admission is not None and plan.admission.max_weight_fraction is None
    assert "no smaller quantisation helps" in plan.admission.text


def test_uniform_and_memory_baselines_split_as_documented() -> None:
    members = fleet(40, 20, 20)
    plan = make_plan(members, MODEL, Workload(1, 16))
    order = plan.order
    chain = [*order[1:], order[0]]
    uniform = plan.baselines["uniform"]
    assert [uniform.ranges[n] for n in chain] == [(0, 3), (3, 6), (6, 8)]
    memory = plan.baselines["memory"]
    sizes = [memory.ranges[n][1] - memory.ranges[n][0] for n in chain]
    assert sum(sizes) == 8 and sizes[chain.index("m0")] == 4  # half the memory, half the layers
    # Kafila's bottleneck is never worse than a feasible baseline's on the same fleet.
    assert plan.kafila.bottleneck_seconds is not None
    for b in plan.baselines.values():
        if b.feasible:
            assert plan.kafila.bottleneck_seconds <= b.bottleneck_seconds  # type: ignore[operator]


def test_memory_baseline_cannot_place_when_a_member_gets_no_layer() -> None:
    members = fleet(100, 1, 1)
    plan = make_plan(members, ModelSpec("four", (10**8,) * 4, (0,) * 4, 1, 1), Workload(1, 1))
    memory = plan.baselines["memory"]
    assert not memory.feasible and "no block" in (memory.reason or "")


KEYS = [
    "feasible",
    "reason",
    "order",
    "head",
    "ranges",
    "stage_seconds",
    "bottleneck_seconds",
    "circuit_seconds",
    "utilisation",
    "edges",
    "memory_bytes",
    "ttft",
]


def test_json_schema_is_stable() -> None:
    plan = make_plan(fleet(20, 20, 20), MODEL, Workload(1, 16))
    data = json.loads(json.dumps(plan.to_json()))
    assert list(data) == [*KEYS, "baselines"]
    assert list(data["baselines"]) == ["uniform", "memory"]
    for b in data["baselines"].values():
        assert list(b) == KEYS
    assert data["feasible"] is True and data["reason"] is None
    assert data["head"] == data["order"][0]
    assert set(data["ranges"]) == set(data["order"]) and all(len(r) == 2 for r in data["ranges"].values())
    assert all(isinstance(v, int) for v in data["memory_bytes"].values())
    assert all(set(e) == {"a", "b", "predicted", "cost_ms"} for e in data["edges"])
    assert len(data["edges"]) == 3
    assert abs(data["utilisation"] - sum(data["stage_seconds"].values()) / (3 * data["bottleneck_seconds"])) < 1e-12


def test_json_of_a_rejected_plan_keeps_the_schema() -> None:
    data = make_plan(fleet(1, 1), MODEL, Workload(1, 16)).to_json()
    assert list(data) == [*KEYS, "baselines"]
    assert data["feasible"] is False and data["reason"] and data["head"] is None
    assert data["bottleneck_seconds"] is None and data["ranges"] == {}
    assert data["baselines"]["uniform"]["feasible"] is False

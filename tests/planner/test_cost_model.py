"""The extended cost model (per-block time, MoE reads, sliding-window KV, cut rules) against brute force."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations, permutations, product
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafila.errors import PlanInputError
from kafila.model.describe import ModelInfo
from kafila.planner import Member, ModelSpec, NatClass, Workload, make_plan
from kafila.planner.cost import expected_experts, read_bytes
from tests.planner.brute import best_plan, cut_ok, need, stage_time
from tests.planner.strategies import instances

pytestmark = pytest.mark.fast

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tolerance(members: tuple[Member, ...], model: ModelSpec) -> float:
    """How far the planner's float seconds may be from the exact ones: float rounding, the half byte of a
    block-equivalent unembedding, and the half byte each MoE block's expected read is rounded to."""
    slowest = min(m.bandwidth for m in members)
    moe = 0.5 * model.k if any(model.expert_bytes) else 0.0
    unembed = 0.5 if any(m.unembed_bandwidth is not None for m in members) else 0.0
    return (moe + unembed) / slowest + 1e-9


@pytest.mark.slow
@SETTINGS
@given(instances(extended=True))
def test_extended_model_same_optimum_as_brute_force(case) -> None:  # type: ignore[no-untyped-def]
    members, model, workload = case
    plan = make_plan(members, model, workload)
    expected = best_plan(members, model, workload)
    if expected is None:
        assert not plan.feasible
        return
    assert plan.feasible, plan.kafila.reason
    tol = tolerance(members, model)
    assert plan.kafila.bottleneck_seconds == pytest.approx(float(expected[1]), rel=1e-12, abs=tol)
    by_name = {m.name: m for m in members}
    for name, (a, e) in plan.ranges.items():
        head = name == plan.head
        assert cut_ok(model, a, e)
        assert plan.kafila.memory_bytes[name] == need(model, workload, a, e, head) <= by_name[name].memory
        exact = stage_time(by_name[name], model, a, e, head, workload.concurrency)
        assert plan.kafila.stage_seconds[name] == pytest.approx(float(exact), rel=1e-12, abs=tol)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(extended=True, min_members=4, min_blocks=10))
def test_extended_model_largest_shapes(case) -> None:  # type: ignore[no-untyped-def]
    test_extended_model_same_optimum_as_brute_force.hypothesis.inner_test(case)  # type: ignore[attr-defined]


@given(st.integers(1, 6), st.data())
@settings(max_examples=60, deadline=None)
def test_expected_experts_is_the_mean_over_every_routing(n: int, data: st.DataObject) -> None:
    # Ground truth by enumeration: every row picks k of n experts, all choices equally likely.
    k = data.draw(st.integers(1, n))
    batch = data.draw(st.integers(1, 3 if n <= 4 else 2))
    subsets = list(combinations(range(n), k))
    total = Fraction(0)
    for rows in product(subsets, repeat=batch):
        total += len(set().union(*rows))
    mean = total / len(subsets) ** batch
    assert expected_experts(n, k, batch) == pytest.approx(float(mean), rel=1e-12)


def test_expected_experts_for_qwen3_30b_a3b() -> None:
    # DESIGN §3: 128 experts, 8 used: 8 at one row, ~29 at four
    assert expected_experts(128, 8, 1) == pytest.approx(8.0)
    assert expected_experts(128, 8, 4) == pytest.approx(29.1, abs=0.05)


def test_moe_reads_grow_with_the_admitted_batch_and_dense_ones_do_not() -> None:
    moe = ModelSpec("moe", (1000,) * 4, (0,) * 4, 0, 0, expert_bytes=(100,) * 4, experts=8, experts_used=2)
    dense = ModelSpec("dense", (1000,) * 4, (0,) * 4, 0, 0)
    assert read_bytes(moe, 1) == (400,) * 4  # 1000 − 8·100 dense + 2 experts
    assert read_bytes(moe, 4) == (200 + round(8 * (1 - 0.75**4) * 100),) * 4
    assert read_bytes(dense, 1) == read_bytes(dense, 16) == (1000,) * 4
    member = (Member("a", 100.0, 0.0, 10**9, 0.0),)
    t1 = make_plan(member, moe, Workload(1, 8)).kafila.bottleneck_seconds
    t4 = make_plan(member, moe, Workload(4, 8)).kafila.bottleneck_seconds
    assert t1 == 16.0 and t4 is not None and t4 > t1


def test_window_layers_reserve_kv_for_the_whole_context() -> None:
    # the stage engine's window caches hold every position (tests/engine/test_window_cache.py); reserving the
    # window alone admitted rings whose caches did not fit
    model = ModelSpec("w", (10,) * 4, (1,) * 4, 0, 0, kv_window=(16, 0, 16, 0))
    plan = make_plan((Member("a", 1.0, 0.0, 10**9, 0.0),), model, Workload(2, 1000))
    assert plan.kafila.memory_bytes["a"] == 40 + 2 * 4 * 1000
    # a member with room for the window-sized caches only is refused
    tight = make_plan((Member("a", 1.0, 0.0, 40 + 2 * (16 + 1000 + 16 + 1000), 0.0),), model, Workload(2, 1000))
    assert not tight.kafila.feasible


def test_per_block_time_moves_blocks_to_the_member_without_it() -> None:
    # Same bandwidth, but each block costs "slow" 10 s more: 2 blocks (40 s) against fast's 4 (40 s), not 3 and 3.
    slow = Member("slow", 1.0, 0.0, 10**9, 0.0, block_s=10.0)
    fast = Member("fast", 1.0, 0.0, 10**9, 0.0)
    plan = make_plan((slow, fast), ModelSpec("m", (10,) * 6, (0,) * 6, 0, 0), Workload(1, 1))
    a, e = plan.ranges["slow"]
    assert e - a == 2 and plan.kafila.bottleneck_seconds == 40.0


def gpt_oss_info(flags: tuple[bool, ...], arch: str = "gpt-oss") -> ModelInfo:
    k = len(flags)
    return ModelInfo(path=Path("m.gguf"), name="m", arch=arch, quant="Q4_0", n_blocks=k, n_embd=64, n_head=4,
                     context_length=256, vocab_size=32, blocks_bytes=(100,) * k, kv_bytes_per_token=(1,) * k,
                     unembed_bytes=10, head_bytes=20, tied_output=False, file_bytes=1, window_layers=flags,
                     window_tokens=16)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=10), st.integers(1, 4), st.data())
def test_plans_never_cut_where_the_model_says_a_stage_is_invalid(flags: list[bool], m: int,
                                                                  data: st.DataObject) -> None:
    info = gpt_oss_info(tuple(flags))
    spec = ModelSpec.described(info)
    members = tuple(Member(f"n{i}", data.draw(st.sampled_from([1.0, 3.0])), 0.0,
                           data.draw(st.sampled_from([10**9, 450, 250])), 0.0, NatClass.ORDINARY) for i in range(m))
    if m > len(flags):
        return
    if sum(flags) < m:
        with pytest.raises(PlanInputError, match="sliding-window blocks"):
            make_plan(members, spec, Workload(1, 4))
        return
    workload = Workload(1, 4)
    plan = make_plan(members, spec, workload)
    # Ground truth: the model layer's own judgement of each stage, searched exhaustively.
    valid = [(0, *cuts, len(flags)) for cuts in combinations(range(1, len(flags)), m - 1)
             if all(info.stage_problem(a, e) is None for a, e in zip((0, *cuts), (*cuts, len(flags)), strict=True))]
    assert valid  # at least m flags: some partition holds one in every stage
    # ... and whether some order of the members holds one of them within its memory (the head last, with the
    # embedding and output: DESIGN §3's need)
    fits = any(all(need(spec, workload, bounds[p], bounds[p + 1], p == m - 1) <= mem.memory
                   for p, mem in enumerate(order))
               for bounds in valid for order in permutations(members))
    assert plan.feasible == fits, plan.kafila.reason
    if fits:
        assert all(info.stage_problem(a, e) is None for a, e in plan.ranges.values())


def test_a_whole_only_model_refuses_a_ring_of_two() -> None:
    info = gpt_oss_info((True, False) * 31, arch="gemma3")  # 62 blocks: Gemma 3 27B's count
    assert info.whole_only and info.stage_problem(0, 10) is not None
    spec = ModelSpec.described(info)
    fleet = (Member("a", 1.0, 0.0, 10**9, 0.0), Member("b", 1.0, 0.0, 10**9, 0.0))
    with pytest.raises(PlanInputError, match="only whole"):
        make_plan(fleet, spec, Workload(1, 4))
    assert make_plan(fleet[:1], spec, Workload(1, 4)).feasible


@pytest.mark.parametrize("stem", ["qwen3-30b-a3b-q4_k_m", "gpt-oss-20b-mxfp4", "gemma3-27b-q4_k_m"])
def test_bench_model_files_round_trip_and_match_their_generator(stem: str) -> None:
    import json

    from kafila.bench.moe_models import MODELS
    from kafila.planner.schema import model_to_json, parse_model

    bench = Path(__file__).resolve().parents[2] / "bench" / f"{stem}.json"
    data = json.loads(bench.read_text())
    assert data == MODELS[stem]()  # the shipped file is what the published shapes give
    model = parse_model(data)
    assert parse_model(model_to_json(model)) == model


@pytest.mark.parametrize(("change", "message"), [
    ({"expert_bytes": [1, 2]}, "expert_bytes has 2 entries, blocks_bytes has 4"),
    ({"expert_bytes": [10, 10, 10, 10], "experts": 4, "experts_used": 5}, "experts_used must be between 1 and"),
    ({"expert_bytes": [30, 30, 30, 30], "experts": 4, "experts_used": 1}, "less than its 4 experts of 30 bytes"),
    ({"kv_window": [-1, 0, 0, 0]}, "kv_window must be a list of integers >= 0"),
    ({"must_hold": [1, 0, 0, 0]}, "must_hold must be a list of true/false"),
    ({"must_hold": [True, False, False, False]}, "at most 1 members can share it; the fleet has 2"),
    ({"whole_only": "yes"}, "whole_only must be true or false"),
])
def test_bad_moe_window_and_cut_fields_are_named(change: dict[str, object], message: str) -> None:
    from kafila.planner.schema import parse_model

    data = {"name": "m", "blocks_bytes": [100] * 4, "kv_bytes_per_token": [1] * 4, "unembed_bytes": 1,
            "head_bytes": 1, **change}
    fleet = (Member("a", 1.0, 0.0, 10**9, 0.0), Member("b", 1.0, 0.0, 10**9, 0.0))
    with pytest.raises(PlanInputError, match=message):
        make_plan(fleet, parse_model(data), Workload(1, 4))

"""The planner against brute force (every order × head × contiguous partition) on small instances."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, event, given, settings

from kafila.planner import Member, ModelSpec, NatClass, Workload, make_plan
from kafila.planner.order import heuristic_cycle, ring_cost
from tests.planner.brute import best_plan, cheapest_cycle_cost, need, stage_time
from tests.planner.strategies import instances

pytestmark = pytest.mark.fast

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_valid(plan, members: tuple[Member, ...], model: ModelSpec, workload: Workload) -> None:  # type: ignore[no-untyped-def]
    """Ranges are contiguous, non-empty, cover [0, k), head last, within memory, and match the numbers."""
    by_name = {m.name: m for m in members}
    order = plan.order
    assert plan.head == order[0]
    assert sorted(order) == sorted(by_name)
    chain = [*order[1:], order[0]]
    start = 0
    for name in chain:
        a, e = plan.ranges[name]
        assert a == start and e > a
        start = e
    assert start == model.k
    for name in order:
        a, e = plan.ranges[name]
        head = name == plan.head
        assert plan.kafila.memory_bytes[name] == need(model, workload, a, e, head) <= by_name[name].memory
        assert plan.kafila.stage_seconds[name] == seconds(stage_time(by_name[name], model, a, e, head), members)
    assert plan.kafila.bottleneck_seconds == max(plan.kafila.stage_seconds.values())


def seconds(exact: Fraction, members: tuple[Member, ...]):  # type: ignore[no-untyped-def]
    """`exact` as the planner may report it: to float rounding, and to the half byte it keeps an unembedding
    at another speed in (block-equivalent whole bytes, so U/u becomes round(U·b/u)/b: at most 0.5/b off)."""
    half_byte = max((0.5 / m.bandwidth for m in members if m.unembed_bandwidth is not None), default=0.0)
    return pytest.approx(float(exact), rel=1e-12, abs=half_byte + 1e-12)


def ms_exact(ring_cost_ms: float) -> Fraction:
    """The plan's ring cost as an exact number (every rtt the strategies draw is a whole number of ns)."""
    return Fraction(round(ring_cost_ms * 1e6), 10**6)


@pytest.mark.slow
@SETTINGS
@given(instances())
def test_same_feasibility_bottleneck_and_ring_cost_as_brute_force(case) -> None:  # type: ignore[no-untyped-def]
    members, model, workload = case
    event(f"m={len(members)} k={model.k // 4 * 4}+")
    plan = make_plan(members, model, workload)
    expected = best_plan(members, model, workload)
    if expected is None:
        assert not plan.feasible
        assert plan.admission is not None and plan.kafila.reason == plan.admission.text
        return
    assert plan.feasible, plan.kafila.reason
    cost, bottleneck = expected
    assert plan.kafila.bottleneck_seconds == seconds(bottleneck, members)
    assert ms_exact(plan.ring_cost_ms) == cost
    _check_valid(plan, members, model, workload)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(min_members=4, min_blocks=10))
def test_largest_shapes_against_brute_force(case) -> None:  # type: ignore[no-untyped-def]
    test_same_feasibility_bottleneck_and_ring_cost_as_brute_force.hypothesis.inner_test(case)  # type: ignore[attr-defined]


@SETTINGS
@given(instances(max_members=5, max_blocks=9))
def test_ring_cost_is_the_minimum_over_every_cycle_when_memory_allows(case) -> None:  # type: ignore[no-untyped-def]
    members, model, workload = case
    roomy = tuple(Member(m.name, m.bandwidth, m.dispatch_s, 10**9, m.rtt_ms, m.nat) for m in members)
    plan = make_plan(roomy, model, workload)
    assert plan.feasible
    assert ms_exact(plan.ring_cost_ms) == cheapest_cycle_cost(roomy)
    # The plan's own edges add up to its ring cost.
    assert round(sum(e.cost_ms for e in plan.kafila.edges) * 1e6) == round(plan.ring_cost_ms * 1e6)


@settings(max_examples=30, deadline=None)
@given(instances(max_members=5, max_blocks=8))
def test_plan_is_deterministic_and_independent_of_input_order(case) -> None:  # type: ignore[no-untyped-def]
    members, model, workload = case
    a = make_plan(members, model, workload).to_json()
    b = make_plan(tuple(reversed(members)), model, workload).to_json()
    assert a == b


def test_large_ring_uses_the_heuristic_and_stays_valid() -> None:
    members = tuple(
        Member(f"m{i:02d}", (1 + i % 4) * 1e9, 1e-4, 10**10, 5.0 * i, list(NatClass)[i % 4]) for i in range(11)
    )
    blocks = tuple(100_000_000 + 1_000_000 * (j % 3) for j in range(40))
    model = ModelSpec("big", blocks, (1024,) * 40, 10**8, 2 * 10**8)
    plan = make_plan(members, model, Workload(1, 512))
    assert plan.feasible and not plan.exact_order
    _check_valid(plan, members, model, Workload(1, 512))


def test_heuristic_cycle_is_two_opt_optimal_on_a_line() -> None:
    # Points on a line: the optimal tour visits them in order and back, cost 2 × span.
    pos = [0, 7, 3, 9, 1, 5]
    cost = [[abs(a - b) for b in pos] for a in pos]
    cycle = heuristic_cycle(cost)
    assert sorted(cycle) == list(range(len(pos)))
    assert ring_cost(cycle, cost) == 2 * (max(pos) - min(pos))


def test_single_member_holds_everything_with_no_edges() -> None:
    members = (Member("solo", 1e9, 0.001, 10**9, 10.0),)
    model = ModelSpec("m", (10, 20, 30), (1, 1, 1), 5, 7)
    plan = make_plan(members, model, Workload(1, 8))
    assert plan.feasible and plan.order == ("solo",) and plan.ranges == {"solo": (0, 3)}
    assert plan.kafila.edges == ()


def test_head_time_counts_the_unembedding_at_its_measured_speed() -> None:
    # 'a' streams blocks at 1 byte/s but unembeds at 4: its 40-byte unembedding costs 10 s, not 40 s
    members = (Member("a", 1.0, 0.5, 10**9, 0.0, unembed_bandwidth=4.0),)
    model = ModelSpec("m", (10, 20), (0, 0), 40, 0)
    plan = make_plan(members, model, Workload(1, 1))
    assert plan.feasible and plan.kafila.stage_seconds["a"] == 0.5 + 30 / 1.0 + 40 / 4.0


def test_head_time_counts_the_unembedding_fixed_time() -> None:
    # the same, with 2 s fixed to every unembedding (the probe's fit of two vocabularies): 0.5 + 30 + 2 + 10
    members = (Member("a", 1.0, 0.5, 10**9, 0.0, unembed_bandwidth=4.0, unembed_s=2.0),)
    plan = make_plan(members, ModelSpec("m", (10, 20), (0, 0), 40, 0), Workload(1, 1))
    assert plan.feasible and plan.kafila.stage_seconds["a"] == 0.5 + 30 / 1.0 + 2.0 + 40 / 4.0


def test_a_fast_unembedding_moves_the_head() -> None:
    # equal but for the unembedding (40 bytes): heading, "fast" adds 4 s and "slow" 40 s; best is
    # fast with 3 blocks (30 + 4 s) against slow's 3 blocks (30 s)
    slow, fast = Member("slow", 1.0, 0.0, 10**9, 0.0), Member("fast", 1.0, 0.0, 10**9, 0.0, unembed_bandwidth=10.0)
    plan = make_plan((slow, fast), ModelSpec("m", (10,) * 6, (0,) * 6, 40, 0), Workload(1, 1))
    assert plan.order[0] == "fast" and plan.kafila.bottleneck_seconds == 34.0


def test_two_members_use_the_one_pair_both_ways() -> None:
    members = (Member("a", 1e9, 0.0, 10**9, 10.0), Member("b", 2e9, 0.0, 10**9, 30.0))
    plan = make_plan(members, ModelSpec("m", (10, 20, 30, 40), (0,) * 4, 5, 7), Workload(1, 1))
    assert [(e.a, e.b) for e in plan.kafila.edges] in ([("a", "b"), ("b", "a")], [("b", "a"), ("a", "b")])
    assert plan.ring_cost_ms == 2 * 40.0  # unknown NAT: relayed, r_a + r_b each way


def test_falls_back_to_a_dearer_order_when_no_cheapest_order_fits() -> None:
    # Found by random search: every cheapest cycle puts the two 30-byte blocks where nobody can hold them.
    nat = NatClass
    members = (
        Member("n0", 1.0, 0.0, 33, 30.0, nat.UNKNOWN),
        Member("n1", 1.0, 0.0, 33, 0.0, nat.ORDINARY),
        Member("n2", 1.0, 0.0, 25, 30.0, nat.UNKNOWN),
        Member("n3", 1.0, 0.0, 13, 30.0, nat.RESTRICTIVE),
        Member("n4", 1.0, 0.0, 20, 30.0, nat.PERMISSIVE),
    )
    model = ModelSpec("x", (30, 2, 30, 2, 2), (0,) * 5, 0, 20)
    plan = make_plan(members, model, Workload(1, 1))
    expected = best_plan(members, model, Workload(1, 1))
    assert plan.feasible and expected is not None
    assert ms_exact(plan.ring_cost_ms) == expected[0] > cheapest_cycle_cost(members)
    assert plan.kafila.bottleneck_seconds == expected[1]

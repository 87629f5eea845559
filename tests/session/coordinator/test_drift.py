"""When a member's measured stage time has left its prediction long enough to plan again (pure: times in)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.net.trust import VerifiedMember
from kafila.planner import ModelSpec, NatClass, Workload, make_plan
from kafila.session.coordinator.drift import HOLD_S, SETTLE_S, SLOWER, Drift, DriftWatch, measured_speed
from kafila.session.coordinator.planning import cuts_enough, planner_member

pytestmark = pytest.mark.fast

PREDICTED = 0.010


def feed(watch: DriftWatch, start: float, end: float, ratio: float, who: str = "bo",
         step: float = 1.0) -> Drift | None:
    """Stats each `step` s from `start` to `end` (inclusive) with `who` at `ratio` × its prediction and a
    fresh median each time (the ring decodes); the last verdict."""
    verdict, t, i = None, start, 0
    while t <= end + 1e-9:
        jitter = 1 + 1e-6 * (i % 2)  # a median that moves: news
        verdict = watch.observe(t, {"ada": (PREDICTED, PREDICTED * jitter),
                                    who: (PREDICTED, PREDICTED * ratio * jitter)})
        t, i = t + step, i + 1
    return verdict


def test_a_member_slower_for_the_hold_time_calls_for_a_plan_and_not_before() -> None:
    w = DriftWatch()
    assert feed(w, 0, HOLD_S - 1, 1.6) is None
    d = feed(w, HOLD_S, HOLD_S, 1.6)
    assert d is not None and d.member == "bo" and d.factor == pytest.approx(1.6, rel=1e-5)
    assert "1.6× slower" in d.text()


def test_a_dip_below_the_threshold_starts_the_hold_over() -> None:
    w = DriftWatch()
    feed(w, 0, 20, 1.6)
    feed(w, 21, 21, 1.2)
    assert feed(w, 22, 22 + HOLD_S - 2, 1.6) is None
    assert feed(w, 22 + HOLD_S, 22 + HOLD_S, 1.6) is not None


def test_an_idle_rings_last_figures_are_no_drift() -> None:
    # the same median second after second: nothing was computed, the 1.6x is old news
    w = DriftWatch()
    assert all(w.observe(float(t), {"bo": (PREDICTED, PREDICTED * 1.6)}) is None for t in range(int(HOLD_S) * 2))


def test_not_planned_back_faster_within_the_settle_time_unless_twice_as_fast() -> None:
    w = DriftWatch()
    w.planned_again("bo", 0.0)
    assert feed(w, 1, 1 + HOLD_S + 5, 0.6) is None  # 1.7x faster, planned 35 s ago: stays
    assert feed(w, 40, 40 + HOLD_S, 0.45) is not None  # 2.2x faster: planned again
    w.planned_again("bo", 100.0)
    assert feed(w, 100 + SETTLE_S, 100 + SETTLE_S + HOLD_S, 0.6) is not None  # the settle time is over


def test_a_dismissed_drift_is_no_news_for_the_settle_time() -> None:
    w = DriftWatch()
    w.dismiss("bo", 0.0)
    assert feed(w, 0, SETTLE_S - 1, 3.0) is None
    assert feed(w, SETTLE_S, SETTLE_S + HOLD_S, 3.0) is not None


@given(st.lists(st.floats(0.5, 3.0), min_size=1, max_size=80))
def test_a_verdict_only_after_hold_s_of_fresh_drift_one_way(ratios: list[float]) -> None:
    w = DriftWatch()
    for t, r in enumerate(ratios):
        d = w.observe(float(t), {"bo": (PREDICTED, PREDICTED * r * (1 + 1e-6 * (t % 2)))})
        if d is not None:
            window = ratios[max(0, t - int(HOLD_S)):t + 1]
            assert len(window) > HOLD_S  # it held that long
            slow = all(x >= 1.5 - 1e-6 for x in window)
            fast = all(x <= 1 / 1.5 + 1e-6 for x in window)
            assert slow or fast, window


def test_a_new_plan_for_a_drift_takes_every_stage_at_its_measured_speed() -> None:
    # the drifting member by its drift; the others by their running medians, so a probe that misjudged one by
    # less than a drift is put right at the same plan (it had made the new plan's prediction 10-15 % off)
    stages = {"ada": (0.010, 0.012), "bo": (0.010, 0.040), "cy": (0.010, None), "dee": (0.010, 0.010 * SLOWER)}
    speed = measured_speed({"ada": 2.0, "bo": 1.0}, stages, Drift("bo", 0.010, 0.040))
    assert speed["ada"] == pytest.approx(2.4) and speed["bo"] == pytest.approx(4.0)
    assert speed["dee"] == pytest.approx(SLOWER)  # off by a drift of its own: measured all the same
    assert "cy" not in speed  # unmeasured: as planned


def test_a_machine_loaded_as_a_whole_is_not_planned_again() -> None:
    # every stage 3x its prediction: the plan at the measured speeds keeps the slowest stage at 3x, so no new plan
    # cuts it (only the drifting member taken at its measured speed, the others would look 3x faster than they run)
    fleet = {n: VerifiedMember(n.encode(), n, b"", NatClass.ORDINARY, None, None, None, 5.0,
                               {"bw": bw, "disp": 2e-4, "mem": 8 << 30, "ubw": bw, "blk": 5e-5})
             for n, bw in (("ada", 4e9), ("bo", 6e9), ("cy", 9e9))}
    model = ModelSpec("m", (8 << 20,) * 30, (1024,) * 30, 40 << 20, 40 << 20)

    def plan(speed: dict[str, float]) -> tuple[dict[str, tuple[int, int]], dict[str, float], float]:
        p = make_plan([planner_member(fleet[n], speed.get(n, 1.0)) for n in fleet], model, Workload()).kafila
        return p.ranges, p.stage_seconds, p.bottleneck_seconds

    ranges, predicted, slowest = plan({})
    stages = {n: (s, 3 * s) for n, s in predicted.items()}
    drift = max((Drift(n, p, m) for n, (p, m) in stages.items()), key=lambda d: d.factor)
    new_ranges, _, new_slowest = plan(measured_speed({}, stages, drift))
    assert new_ranges == ranges and new_slowest == pytest.approx(3 * slowest)
    assert not cuts_enough(3 * slowest, new_slowest)

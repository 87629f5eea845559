"""`kafila bench drift`'s measure: a reply's median token against the token its plan predicts, the time outside
the stages counted on both sides."""

from __future__ import annotations

import pytest

from kafila.bench.drift import cy_slower, plan_speed

pytestmark = pytest.mark.fast


def _stats(interval_ms: float, stages: dict[str, tuple[float, float | None]]) -> dict[str, object]:
    return {"token_interval_median_ms": interval_ms,
            "stages": {n: {"predicted_s": p / 1e3, "measured_s": None if m is None else m / 1e3}
                       for n, (p, m) in stages.items()}}


def test_stages_slower_than_planned_lower_the_ratio_by_their_excess_alone() -> None:
    # 20 ms a token, 18 of them in stages planned at 15: the plan predicts 15 + the 2 outside
    speed = plan_speed(_stats(20.0, {"ada": (5.0, 6.0), "bo": (5.0, 6.0), "cy": (5.0, 6.0)}))
    assert speed["outside_ms"] == pytest.approx(2.0)
    assert speed["predicted_token_ms"] == pytest.approx(17.0)
    assert speed["ratio"] == pytest.approx(0.85) and not speed["target_met"]
    assert speed["stages_ms"]["cy"] == pytest.approx({"predicted": 5.0, "measured": 6.0})


def test_stages_on_their_plan_meet_the_target_however_long_the_time_outside() -> None:
    speed = plan_speed(_stats(40.0, {"ada": (6.0, 6.0), "bo": (6.0, 5.5), "cy": (6.0, None)}))
    assert speed["ratio"] == pytest.approx((18.0 + 40.0 - 11.5) / 40.0) and speed["target_met"]


@pytest.mark.parametrize(("slower", "expected"), [
    ({"cy": 4.0}, True),  # cy alone measured slower (the others ran as planned)
    ({"ada": 0.35, "bo": 0.2, "cy": 0.89}, True),  # every stage over-predicted by a shared probe: cy 2.5x the rest
    ({"ada": 1.0, "cy": 1.2}, False),  # within a drift of the others
    ({"bo": 0.25}, False),  # cy not re-measured
])
def test_cy_slower_is_beside_the_other_members(slower: dict[str, float], expected: bool) -> None:
    assert cy_slower({"slower": slower}) is expected

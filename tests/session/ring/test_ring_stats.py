"""The head's running stage-time figures: medians of the last STATS_WINDOW decode calls; shown on a session's state."""

from __future__ import annotations

import pytest

from kafila.session.protocol import messages
from kafila.session.ring.ring_stats import STATS_WINDOW, RingStats, show_stats
from kafila.session.state import EdgeView, SessionState, StageStats

pytestmark = pytest.mark.fast


def test_a_stray_slow_call_does_not_move_the_figure_and_old_calls_are_forgotten() -> None:
    stats = RingStats({"ada": 0.030, "bo": 0.020})
    assert stats.measured == {} and stats.network_share is None
    for _ in range(9):
        stats.add(["ada", "bo"], (30_000_000, 20_000_000), 60_000_000)  # 10 ms of 60 outside compute
    stats.add(["ada", "bo"], (300_000_000, 20_000_000), 330_000_000)  # one call preempted for 270 ms
    assert stats.measured == {"ada": 0.030, "bo": 0.020}
    assert abs(stats.network_share - 1 / 6) < 1e-12
    for _ in range(STATS_WINDOW):  # the ring slowed down: the figure follows within one window
        stats.add(["ada", "bo"], (45_000_000, 20_000_000), 0)  # no round trip: the share keeps its samples
    assert stats.measured == {"ada": 0.045, "bo": 0.020}
    assert abs(stats.network_share - 1 / 6) < 1e-12
    sent = stats.message()
    assert sent.stages["ada"].measured_s == 0.045 and sent.stages["ada"].predicted_s == 0.030
    assert stats.as_dict()["stages"]["bo"] == {"predicted_s": 0.020, "measured_s": 0.020}


def test_the_heads_figures_are_shown_on_the_state_for_the_planned_stages_and_listeners_are_told() -> None:
    state = SessionState(stages={"ada": StageStats(0.030)})
    told: list[SessionState] = []
    state.subscribe(told.append)
    stats = messages.Stats({"ada": messages.StageTime(0.030, 0.045), "gone": messages.StageTime(0.02, 0.02)},
                           0.25, 12.5, messages.TtftTime(40, 0.5, 0.4))
    show_stats(state, stats)
    assert state.stages == {"ada": StageStats(0.030, 0.045)}  # a stage the plan no longer has is not added
    assert (state.network_share, state.tokens_per_s) == (0.25, 12.5)
    assert state.ttft == {"prompt_tokens": 40, "measured_s": 0.5, "predicted_s": 0.4} and told == [state]
    show_stats(state, messages.Stats({}, None, None))
    assert state.ttft is None and state.network_share is None and len(told) == 2


def test_the_circuits_time_outside_compute_replaces_the_links_round_trips_in_the_token_time() -> None:
    # on loopback QUIC's round trips (read as each edge opened) left out each hop's software, and counted the
    # handshake's crypto: the serving ring's own circuits measure the edges' share instead
    state = SessionState(plan={"stage_seconds": {"ada": 0.003, "bo": 0.004}},
                         edges=[EdgeView("ada", "bo", "direct", "direct", 1.0, 3.0),
                                EdgeView("bo", "ada", "direct", "direct", 1.0, 5.0)])
    assert state.token_time() == {"stages_s": 0.007, "edges_s": 0.004, "edges_from": "quic",
                                  "edges_quic_s": 0.004, "predicted_s": 0.011}
    stats = RingStats({"ada": 0.003, "bo": 0.004})
    for gap_ms in (2, 1, 9):  # the median: a preempted circuit does not move it
        stats.add(["ada", "bo"], (3_000_000, 4_000_000), 7_000_000 + gap_ms * 1_000_000)
    show_stats(state, stats.message())
    t = state.token_time()
    assert t is not None and t["edges_from"] == "circuits" and t["edges_quic_s"] == 0.004
    assert t["edges_s"] == pytest.approx(0.002) and t["predicted_s"] == pytest.approx(0.009)
    stats.turnaround(1_500_000)  # the head's own time per token (sampling, streaming it) is a circuit's too
    assert stats.circuit_gap_s == pytest.approx(0.0035) and stats.circuit_costs() == pytest.approx((0.0035, 0.007))
    show_stats(state, RingStats({}).message())  # a new ring's head has measured nothing yet
    assert state.token_time()["edges_from"] == "quic"

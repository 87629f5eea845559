"""The pure rendering helpers: bars to scale, sparklines, the matrix cells, the rejection's split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from kafila.session.state import EdgeView, SessionState
from kafila.tui.format import range_bar, sparkline, value_bar
from kafila.tui.widgets.admission import progress_text, split_rejection
from kafila.tui.widgets.plan import bottleneck_member, replans_text, total_blocks, ttft_text
from kafila.tui.widgets.reachability import edges_table, matrix_cell, ring_edges
from tests.tui import states

pytestmark = pytest.mark.fast


@given(st.integers(1, 200), st.integers(1, 120), st.data())
def test_range_bar_is_to_scale_and_never_empty(total: int, width: int, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, total - 1))
    end = data.draw(st.integers(start + 1, total))
    bar = range_bar(start, end, total, width, "red").plain
    assert len(bar) == width
    filled = [i for i, c in enumerate(bar) if c == "█"]
    assert filled and filled == list(range(filled[0], filled[-1] + 1))  # one contiguous run
    assert abs(filled[0] - start * width / total) <= 1  # starts where the range starts, to the cell
    cells = (end - start) * width / total
    if cells >= 1:  # ends where the range ends, and as long as the range, to the cell
        assert abs(filled[-1] + 1 - end * width / total) <= 1
        assert abs(len(filled) - cells) <= 1
    else:  # narrower than a cell: one cell, where the range is
        assert len(filled) == 1 and filled[0] <= start * width / total + 1
    assert filled[0] == 0 or start > 0  # the first range starts in the first cell
    assert filled[-1] == width - 1 or end < total  # the last range ends in the last cell


@given(st.lists(st.integers(0, 10), min_size=2, max_size=8))
def test_contiguous_ranges_tile_the_bar(cuts: list[int]) -> None:
    """Ranges that partition the blocks give bars that, laid over each other, cover every cell."""
    bounds = sorted({0, *(c * 10 for c in cuts), 100})
    covered: set[int] = set()
    for a, b in itertools.pairwise(bounds):
        bar = range_bar(a, b, 100, 50, "x").plain
        covered |= {i for i, c in enumerate(bar) if c == "█"}
    assert covered == set(range(50))


@given(st.floats(0, 10), st.floats(0.01, 10), st.integers(1, 60))
def test_value_bar_width(value: float, scale: float, width: int) -> None:
    bar = value_bar(value, scale, width, "x").plain
    assert len(bar) == width
    partial = " ▏▎▍▌▋▊▉"
    eighths = 8 * bar.count("█") + sum(partial.index(c) for c in bar if c in partial[1:])
    assert bar.rstrip(" ") == bar[:len(bar.rstrip(" "))] and set(bar.rstrip(" ")[:-1]) <= {"█"}  # one run
    want = min(value / scale, 1.0) * width * 8  # eighths of a cell, to scale, capped at the full width
    if value > 0:
        assert eighths >= 1 and abs(eighths - want) <= 1  # never empty for a value, otherwise to the eighth
    else:
        assert eighths == 0


def test_sparkline_scales_to_its_own_range() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▅▅▅"
    assert sparkline(list(range(100)), width=10) == sparkline(list(range(90, 100)))
    assert sparkline([]) == ""


def test_matrix_cells() -> None:
    s = SessionState(predicted={"a": {"b": "direct", "c": "relay"}, "b": {"a": "direct", "c": "direct"},
                                "c": {"a": "relay", "b": "direct"}},
                     edges=[EdgeView("a", "b", "direct", "relayed"), EdgeView("b", "c", "direct", "direct"),
                            EdgeView("c", "a", "relay", "pending")])
    edges = ring_edges(s)
    assert matrix_cell(s, "a", "a", edges).plain == " · "
    assert matrix_cell(s, "a", "b", edges).plain == "!D!"  # wrong: predicted direct, found relayed
    assert matrix_cell(s, "b", "a", edges).plain == "!D!"  # the matrix is symmetric
    assert matrix_cell(s, "b", "c", edges).plain == "[D]"
    assert matrix_cell(s, "a", "c", edges).plain == "[R]"
    s.edges = []
    assert matrix_cell(s, "a", "c", {}).plain == " R "


def test_rejection_split_into_why_and_remedies() -> None:
    text = states.rejected_state().rejection or ""
    why, remedies = split_rejection(text)
    assert why[0].startswith("does not fit in memory") and why[1].startswith("closest layout")
    assert remedies[0].startswith("would admit:") and remedies[-1].startswith("no smaller quantisation")


def test_progress_marks_the_outcome() -> None:
    assert progress_text("planning").plain.startswith("✓waiting › ✓measuring › ●planning › delivering")
    assert progress_text("rejected").plain.endswith("✓planning › ✗ rejected")
    assert progress_text("lost").plain.endswith("✓admitted › ✗ lost")


def test_plan_helpers_on_a_real_plan() -> None:
    plan = states.admitted_state().plan
    assert plan is not None
    assert total_blocks(plan) == 36  # Qwen3-8B
    assert bottleneck_member(plan) == "old-i7-desktop"


def test_ttft_line_shows_the_prediction_and_the_measured_request() -> None:
    placement = {"ttft": {"prompt_tokens": 2000, "seconds": 12.345, "model": {}}}
    assert ttft_text(placement).plain == "time to first token 12.35 s predicted for 2000 prompt tokens"
    seen = {"prompt_tokens": 512, "measured_s": 3.21, "predicted_s": 2.9}
    assert ttft_text(placement, seen).plain.endswith("· last request 3.21 s measured vs 2.90 s predicted "
                                                     "for its 512 tokens")
    assert "not predicted" in ttft_text({"ttft": None}).plain


def test_a_new_plan_around_a_drifting_member_says_who_and_by_how_much() -> None:
    text = replans_text([{"member": "cy", "predicted_s": 0.004, "measured_s": 0.016, "was_bottleneck_s": 0.016,
                          "bottleneck_s": 0.007},
                         {"member": "bo", "predicted_s": 0.010, "measured_s": 0.004, "was_bottleneck_s": 0.011}]).plain
    lines = text.splitlines()
    assert lines[0] == ("planned again: cy ran 4.0× slower than planned (16.00 ms a call, predicted 4.00 ms); "
                        "slowest stage 16.00 ms → 7.00 ms predicted")
    assert lines[1].startswith("planned again: bo ran 2.5× faster than planned") and "→" not in lines[1]
    joined = replans_text([{"member": "dee", "why": "joined", "was_bottleneck_s": 0.012, "bottleneck_s": 0.009}])
    assert joined.plain == "planned again: dee joined; slowest stage 12.00 ms → 9.00 ms predicted"


def test_the_edges_table_shows_each_verified_edges_round_trip() -> None:
    state = SessionState()
    state.edges = [EdgeView("ada", "bo", "direct"), EdgeView("bo", "ada", "direct")]
    state.set_edge("ada", "bo", "direct", 12.4, 41.25)  # a member 20 ms away each way (--link-delay 20)
    console = Console(width=120, record=True)
    console.print(edges_table(state))
    rows = [line.split() for line in console.export_text().splitlines() if "→" in line]
    assert rows[0][1:5] == ["direct", "direct", "12", "41.2"], rows
    assert rows[1][1:5] == ["direct", "pending", "—", "—"], rows  # not verified yet: no round trip to show

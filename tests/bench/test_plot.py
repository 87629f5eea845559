"""The benchmarks' SVG charts (kafila.bench.plot) on small hand-made reports: each parses as XML, holds
its series' names, labels and values, and loads nothing from the network."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kafila.bench import plot
from kafila.bench.report import emit
from tests.conftest import run_kafila

pytestmark = pytest.mark.fast

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    """Every piece of text the chart shows (and its tooltips), after checking it parses as SVG."""
    root = ET.fromstring(svg.encode())
    assert root.tag == f"{SVG}svg"
    return [t.strip() for el in root.iter() for t in (el.text, *(el.attrib.get("title", ""),)) if t and t.strip()]


def self_contained(svg: str) -> None:
    assert "<script" not in svg and "http://" not in svg.replace("http://www.w3.org", "").replace(
        "http://www.w3.org/1999/xlink", "") and "https://" not in svg and "//fonts." not in svg


def placement(ms: float | None, feasible: bool = True) -> dict[str, Any]:
    return {"feasible": feasible, "bottleneck_seconds": None if ms is None else ms / 1000, "utilisation": 0.5,
            "reason": None}


PLANNER: dict[str, Any] = {
    "bench": "planner", "workload": {"concurrency": 4, "context": 4096},
    "fleets": [
        {"fleet": "lan", "model": "Alpha 8B", "kafila": placement(6.4), "uniform": placement(38.0),
         "memory": placement(68.8, feasible=False)},
        {"fleet": "region", "model": "Beta 32B", "kafila": placement(23.2), "uniform": placement(None),
         "memory": placement(123.8)},
        {"fleet": "region", "model": "Gamma 27B", "refused": "can run only whole"},
    ],
}


def test_planner_chart_holds_every_strategy_and_placed_model() -> None:
    svg = plot.planner(PLANNER)
    self_contained(svg)
    shown = texts(svg)
    for label in ("Kafila", "uniform (GPipe-style)", "memory-proportional (exo-style)", "lan · Alpha 8B",
                  "region · Beta 32B", "6.4", "38.0", "68.8", "23.2", "123.8"):
        assert label in shown, label
    assert not any("Gamma" in t for t in shown)  # a refused model has no bars
    assert any("does not fit in memory" in t for t in shown)  # a split that places blocks it cannot hold says so
    assert "4 requests × 4096 tokens" in " ".join(shown)


RING: dict[str, Any] = {
    "bench": "ring", "fleet_throttles": [1.0, 2.0, 4.0, 8.0],
    "latency": {"ratio": 1.62},
    "throughput": {
        "kafila": {"admitted": True, "one_user_tokens_per_s": 21.5, "four_users_tokens_per_s": 48.25},
        "uniform": {"admitted": True, "one_user_tokens_per_s": 9.75, "four_users_tokens_per_s": 17.5},
        "memory": {"admitted": False, "reason": "short of memory"},
    },
}


def test_ring_chart_holds_each_admitted_split_with_one_and_four_users() -> None:
    svg = plot.ring(RING)
    self_contained(svg)
    shown = texts(svg)
    for label in ("1 user", "4 users", "Kafila", "uniform (GPipe-style)", "21.5", "48.2", "9.8", "17.5"):
        assert label in shown, label
    assert "memory-proportional (exo-style)" not in shown  # not admitted: no bars
    joined = " ".join(shown)
    assert "slow-downs 1,2,4,8" in joined and "1.62×" in joined


def target(value: float | None) -> dict[str, Any]:
    return {"value": value, "target": "t", "met": None if value is None else True}


SCALE: dict[str, Any] = {
    "bench": "scale",
    "runs": [
        {"shape": "llama3-8b", "blocks": 6,
         "targets": {"ttft_vs_local": target(1.02), "decode_vs_local": target(0.9), "stage_time_error": target(0.044),
                     "delivery_rss_above_idle_mb": target(12.0)}},
        {"shape": "qwen3-32b", "blocks": 9,
         "targets": {"ttft_vs_local": target(0.98), "decode_vs_local": target(None),
                     "stage_time_error": target(0.101)}},
    ],
}


def test_scale_chart_holds_each_model_and_its_ratios() -> None:
    svg = plot.scale(SCALE)
    self_contained(svg)
    shown = texts(svg)
    for label in ("llama3-8b, 6 blocks", "qwen3-32b, 9 blocks", "TTFT ÷ local (≤ 1.3)", "decode tok/s ÷ local (≥ 0.7)",
                  "1.02", "0.90", "0.04", "0.98", "0.10"):
        assert label in shown, label
    assert "12.00" not in shown  # MB, not a ratio: left out of the chart


def test_svg_picks_the_chart_by_kind_and_refuses_others() -> None:
    assert plot.svg(RING) == plot.ring(RING)
    with pytest.raises(ValueError, match="'engine'"):
        plot.svg({"bench": "engine"})


def test_emit_writes_the_chart_beside_the_report(tmp_path: Path) -> None:
    emit(RING, as_json=False, out=str(tmp_path / "ring.json"), plot=str(tmp_path / "charts" / "ring.svg"))
    assert json.loads((tmp_path / "ring.json").read_text()) == RING
    assert (tmp_path / "charts" / "ring.svg").read_text() == plot.ring(RING)


@pytest.mark.slow  # the whole planner bench, a few seconds
def test_bench_planner_plot_from_the_command_line(tmp_path: Path) -> None:
    out = run_kafila("bench", "planner", "--quick", "--out", str(tmp_path / "p.json"), "--plot",
                     str(tmp_path / "p.svg"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "p.json").read_text())
    shown = texts((tmp_path / "p.svg").read_text())
    placed = [r for r in report["fleets"] if "refused" not in r]
    assert placed and all(f"{r['fleet']} · {r['model']}" in shown for r in placed)
    assert f"{placed[0]['kafila']['bottleneck_seconds'] * 1000:.1f}" in shown


def test_only_charted_benches_take_plot() -> None:
    out = run_kafila("bench", "engine", "--plot", "x.svg", timeout=120)
    assert out.returncode == 2 and "--plot" in out.stderr

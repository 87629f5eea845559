"""SVG charts of benchmark reports (`kafila bench planner|ring|scale --plot FILE`), drawn with pygal.

One pure function per report kind: the report dict (as `--out` writes it) in, the SVG text out.
The charts carry no script and load nothing from the network, so they can be shown as images.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import pygal
from pygal.style import Style

SVG_NS = "http://www.w3.org/2000/svg"
ET.register_namespace("", SVG_NS)
ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")

STRATEGIES = (("kafila", "Kafila"), ("uniform", "uniform (GPipe-style)"), ("memory", "memory-proportional (exo-style)"))
# bench scale's dimensionless targets, in the order a reader asks about them: (key, label)
SCALE_TARGETS = (
    ("ttft_vs_local", "TTFT ÷ local (≤ 1.3)"),
    ("ttft_slowed_vs_unpipelined", "slowed TTFT ÷ unpipelined (≤ 0.7)"),
    ("decode_vs_local", "decode tok/s ÷ local (≥ 0.7)"),
    ("stage_time_error", "stage time error (≤ 0.10)"),
    ("ttft_prediction_error", "TTFT prediction error (≤ 0.25)"),
    ("ttft_slowed_prediction_error", "slowed TTFT prediction error (≤ 0.25)"),
    ("delivery_vs_aioquic", "one link ÷ aioquic (≥ 0.9)"),
    ("ring_delivery_vs_aioquic", "ring's delivery ÷ aioquic (≥ 0.9)"),
    ("reply_identical", "replies identical (share, 1)"),
)
STYLE = Style(
    background="white", plot_background="white", foreground="#333", foreground_strong="#111",
    foreground_subtle="#999", colors=("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"),
    font_family="DejaVu Sans, Helvetica, Arial, sans-serif", title_font_size=15, label_font_size=11,
    major_label_font_size=11, legend_font_size=12, value_font_size=9, value_label_font_size=9,
)


def _config(title: str, series: int, **extra: Any) -> dict[str, Any]:
    # js=(): no tooltip script fetched from the web; no_prefix: no random chart id in the CSS;
    # the legend in one row below the chart (pygal reserves too little room for fewer series than columns)
    return {"title": title, "style": STYLE, "js": (), "no_prefix": True, "legend_at_bottom": True,
            "legend_at_bottom_columns": max(1, series), "print_values": True, "truncate_label": -1,
            "truncate_legend": -1, **extra}


def _render(chart: Any) -> str:
    """The chart's SVG, the same for the same report: without pygal's dated comments and its config script."""
    root = ET.fromstring(str(chart.render(is_unicode=True)).encode())  # the parser drops comments
    for parent in root.iter():
        for child in [c for c in parent if c.tag == f"{{{SVG_NS}}}script"]:
            parent.remove(child)
    if not root.get("id"):
        root.attrib.pop("id", None)
    return "<?xml version='1.0' encoding='utf-8'?>\n" + ET.tostring(root, encoding="unicode") + "\n"


def planner(report: dict[str, Any]) -> str:
    """`bench planner` (b): each fleet × model, the slowest stage of each strategy on the same ring (ms a step)."""
    rows = [r for r in report["fleets"] if "refused" not in r][::-1]  # a horizontal chart draws its first row lowest
    cells = {key: [_stage_ms(r.get(key) or {}) for r in rows] for key, _ in STRATEGIES}
    top = max([v["value"] if isinstance(v, dict) else v for vs in cells.values() for v in vs if v] or [1.0])
    ticks = [m * 10**e for e in range(6) for m in (1, 2, 5) if m * 10**e <= top * 1.5]
    wl = report.get("workload", {})
    chart = pygal.HorizontalBar(**_config(
        f"Slowest stage per decode step, {wl.get('concurrency', '?')} requests × {wl.get('context', '?')} tokens",
        len(STRATEGIES),
        logarithmic=True, zero=1, range=(1, top * 1.5), y_labels=ticks, height=170 + 40 * max(1, len(rows)), width=900,
        x_title="ms per decode step, log scale (lower is better)", value_formatter=lambda v: f"{v:.1f}"))
    chart.x_labels = [f"{r['fleet']} · {r['model']}" for r in rows]
    for key, label in STRATEGIES:
        chart.add(label, cells[key])
    return _render(chart)


def _stage_ms(placement: dict[str, Any]) -> Any:
    """A strategy's slowest stage in ms (None: it cannot place the model), labelled when it does not fit."""
    if placement.get("bottleneck_seconds") is None:
        return None
    ms = placement["bottleneck_seconds"] * 1000
    return ms if placement.get("feasible", True) else {"value": ms, "label": "does not fit in memory"}


def ring(report: dict[str, Any]) -> str:
    """`bench ring` (b): tokens/s of each split on the emulated fleet, with 1 and 4 users."""
    throughput = report["throughput"]
    splits = [k for k, t in throughput.items() if t.get("admitted")]
    throttles = ",".join(f"{t:g}" for t in report.get("fleet_throttles", []))
    ratio = (report.get("latency") or {}).get("ratio")
    chart = pygal.Bar(**_config(
        f"Loopback ring on an emulated fleet (slow-downs {throttles})", 2, width=800, height=450,
        y_title="tokens/s (higher is better)", value_formatter=lambda v: f"{v:.1f}",
        x_title=None if ratio is None else f"decode without slow-downs: ring {ratio:.2f}× one local context"))
    names = dict(STRATEGIES)
    chart.x_labels = [names.get(k, k) for k in splits]
    chart.add("1 user", [throughput[k]["one_user_tokens_per_s"] for k in splits])
    chart.add("4 users", [throughput[k]["four_users_tokens_per_s"] for k in splits])
    return _render(chart)


def scale(report: dict[str, Any]) -> str:
    """`bench scale`: each model's dimensionless figures beside their targets (from issue 11)."""
    runs = report["runs"]
    chart = pygal.HorizontalBar(**_config(
        "bench scale: each figure beside its target", len(runs), width=900,
        height=160 + 22 * len(SCALE_TARGETS) * max(1, len(runs)),
        x_title="ratio or share", value_formatter=lambda v: f"{v:.2f}"))
    chart.x_labels = [label for _, label in SCALE_TARGETS][::-1]  # a horizontal chart draws its first row lowest
    for r in runs:
        targets = r.get("targets") or {}
        chart.add(f"{r['shape']}, {r['blocks']} blocks",
                  [(targets.get(key) or {}).get("value") for key, _ in SCALE_TARGETS][::-1])
    return _render(chart)


PLOTS: dict[str, Callable[[dict[str, Any]], str]] = {"planner": planner, "ring": ring, "scale": scale}


def svg(report: dict[str, Any]) -> str:
    """The chart of a report of any kind `PLOTS` draws, chosen by its `bench` field."""
    try:
        draw = PLOTS[report["bench"]]
    except KeyError:
        raise ValueError(f"no chart for a report of kind {report.get('bench')!r}") from None
    return draw(report)

"""Writing benchmark reports: JSON to stdout or a file, a rich table for people."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from kafila import __version__


def envelope(name: str, results: dict[str, Any]) -> dict[str, Any]:
    """Wrap results with what a reader needs to compare runs: when, where, which version."""
    return {
        "bench": name,
        "kafila": __version__,
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **results,
    }


def emit(report: dict[str, Any], as_json: bool, out: str | None, plot: str | None = None) -> None:
    """Print the report as JSON when asked, save it to `out` when given, and its SVG chart to `plot`."""
    text = json.dumps(report, indent=2, sort_keys=False)
    if as_json:
        print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    if plot:
        from kafila.bench.plot import svg  # pygal only when a chart is asked for

        Path(plot).parent.mkdir(parents=True, exist_ok=True)
        Path(plot).write_text(svg(report))

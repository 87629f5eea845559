"""`kafila bench NAME`: run one benchmark and write its report."""

from __future__ import annotations

import argparse
import importlib

HELP = ("run a benchmark (engine, planner, cost, nat, ring, drift, mixed, scale, wan, grammar, rendezvous) "
        "and write a report")

# Benchmark name -> module under kafila.bench with HELP, configure(parser), run(args).
BENCHES: dict[str, str] = {
    "engine": "engine",
    "planner": "planner",
    "cost": "cost",
    "nat": "nat",
    "ring": "ring",
    "drift": "drift",
    "mixed": "mixed",
    "scale": "scale",
    "wan": "wan",
    "grammar": "grammar",
    "rendezvous": "rendezvous_memory",
}
PLOTTED = ("planner", "ring", "scale")  # the reports kafila.bench.plot draws


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, module_name in BENCHES.items():
        module = importlib.import_module(f"kafila.bench.{module_name}")
        bp = sub.add_parser(name, help=module.HELP, description=module.HELP)
        bp.add_argument("--json", action="store_true", help="print the report as JSON")
        bp.add_argument("--out", default=None, help="also write the report to this file")
        if name in PLOTTED:
            bp.add_argument("--plot", default=None, metavar="FILE", help="also draw the report as an SVG chart here")
        module.configure(bp)
        bp.set_defaults(_bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args) or 0)

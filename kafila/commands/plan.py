"""`kafila plan`: plan a ring for a fleet file and a model, without running anything.

Exit status: 0 when the chosen strategy's plan is feasible, 3 when it is rejected (the reasons
are printed), 1 for bad input files (the CLI prints `kafila: error: …`).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from kafila.commands._common import positive_int

if TYPE_CHECKING:
    from kafila.planner import Member, Plan

HELP = "plan a ring for a fleet and a model: order, head, block ranges, and the baselines beside it"
EXIT_REJECTED = 3



def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", required=True, metavar="FLEET.json", help="the members' measurements")
    p.add_argument(
        "--model",
        default=None,
        metavar="MODEL",
        help="a GGUF file or a model JSON file (default: the embedded SmolLM2-135M)",
    )
    p.add_argument("--concurrency", type=positive_int, default=1, help="concurrent requests to admit (default 1)")
    p.add_argument("--context", type=positive_int, default=4096, help="tokens of context per request (default 4096)")
    p.add_argument("--prompt-tokens", type=positive_int, default=2000,
                   help="predict the time to first token of a prompt this long (default 2000)")
    p.add_argument("--batch", type=positive_int, default=128,
                   help="most rows per stage call: a prompt goes round in chunks of this many (default 128)")
    p.add_argument(
        "--strategy",
        choices=("kafila", "uniform", "memory"),
        default="kafila",
        help="which split to report as the plan (default kafila); the others are shown as baselines",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON (stable schema)")
    p.epilog = f"exit status: 0 feasible, {EXIT_REJECTED} rejected (reasons printed), 1 bad input"


def run(args: argparse.Namespace) -> int:
    from kafila.planner import Workload, make_plan
    from kafila.planner.files import load_fleet, load_model

    members = load_fleet(args.fleet)
    model = load_model(args.model)
    plan = make_plan(members, model, Workload(concurrency=args.concurrency, context=args.context, batch=args.batch,
                                              prompt_tokens=args.prompt_tokens))
    if args.json:
        print(json.dumps(plan.to_json(args.strategy), indent=2))
    else:
        render(plan, members, args.strategy)
    return 0 if plan.placement(args.strategy).feasible else EXIT_REJECTED


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.2f}"


def render(plan: Plan, members: tuple[Member, ...], strategy: str) -> None:
    """Print the plan as rich tables: members × strategies, a summary per strategy, the ring's edges."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    chosen = plan.placement(strategy)
    by_name = {m.name: m for m in members}
    wl = plan.workload
    status = "[green]feasible[/]" if chosen.feasible else "[bold red]REJECTED[/]"
    console.print(
        f"[bold]{plan.model}[/] on {len(members)} members, {wl.concurrency} × {wl.context} tokens — "
        f"strategy [bold]{strategy}[/]: {status}"
    )

    strategies = ["kafila", "uniform", "memory"]
    table = Table(title="ring order, head first: [start, end) blocks and stage ms, ◀ = bottleneck")
    for col in ("#", "member", "NAT", "GB/s", "mem GB", *strategies):
        table.add_column(col, justify="left" if col in ("member", "NAT") else "right")
    for pos, name in enumerate(chosen.order):
        mem = by_name[name]
        cells = [str(pos), name + (" (head)" if pos == 0 else ""), mem.nat.value]
        cells += [f"{mem.bandwidth / 1e9:.0f}", f"{mem.memory / 1e9:.1f}"]
        for s in strategies:
            p = plan.placement(s)
            if name not in p.ranges:
                cells.append("—")
                continue
            a, e = p.ranges[name]
            t = p.stage_seconds[name]
            cell = f"[{a},{e}) {_ms(t)}"
            if p.bottleneck_seconds is not None and t == p.bottleneck_seconds:
                cell = f"[bold yellow]{cell}◀[/]"
            if p.memory_bytes[name] > mem.memory:
                cell += " [red]mem![/]"
            cells.append(cell)
        table.add_row(*cells)
    console.print(table)

    summary = Table(title="strategies side by side (◀ marks each one's bottleneck above)")
    for col in ("strategy", "fits", "bottleneck ms", "utilisation", "circuit ms", "TTFT s", "note"):
        summary.add_column(col, justify="right" if col.endswith(("ms", " s")) or col == "utilisation" else "left")
    for s in strategies:
        p = plan.placement(s)
        util = "—" if p.utilisation is None else f"{p.utilisation:.0%}"
        note = "" if p.feasible else (p.reason or "").split(":")[0]  # the details are in the table and below
        fits = "yes" if p.feasible else "[red]no[/]"
        ttft = "—" if p.ttft is None else f"{p.ttft['seconds']:.2f}"
        summary.add_row(s, fits, _ms(p.bottleneck_seconds), util, _ms(p.circuit_seconds), ttft, note)
    console.print(summary)
    if chosen.ttft is not None:
        console.print(f"time to first token: {chosen.ttft['seconds']:.2f} s predicted for a {wl.prompt_tokens}-token "
                      f"prompt (chunks of {wl.batch} rows; TTFT s above: each strategy's)")
    elif chosen.feasible:
        console.print("[dim]no time to first token predicted: a member of the fleet has no prefill numbers "
                      "(prefill_rows)[/]")

    if chosen.edges:
        edges = Table(title=f"ring edges (predicted cost {plan.ring_cost_ms:.1f} ms in all)")
        for col in ("from", "to", "predicted", "cost ms"):
            edges.add_column(col)
        for edge in chosen.edges:
            edges.add_row(edge.a, edge.b, edge.predicted, f"{edge.cost_ms:.1f}")
        console.print(edges)
    if not plan.exact_order:
        console.print("[dim]ring order from the 2-opt heuristic (too many members for exhaustive search)[/]")
    if not chosen.feasible and chosen.reason:
        console.print(f"[bold red]rejected:[/] {chosen.reason}")

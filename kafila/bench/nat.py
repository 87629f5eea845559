"""`kafila bench nat`: the 9 ordered NAT class pairs in the emulated lab (needs root and nftables).

For each pair (a behind NAT 1 opens the edge to b behind NAT 2): the classes both members
measured, the predicted path, the verified path, and the time from connect() to a usable
link (both certificate pins checked). The link is usable over the relay at once; "verified"
is the path after the punch window.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "NAT lab: 9 class pairs, predicted vs verified path, time to a usable link (needs root)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=1, help="run the 9 pairs this many times (default 1)")
    p.add_argument("--link-delay", type=float, default=0.0, metavar="MS",
                   help="EMULATION: every member holds each datagram it sends this long (members far apart)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import statistics

    from rich.console import Console
    from rich.table import Table

    from kafila.bench.report import emit, envelope
    from kafila.errors import KafilaError
    from kafila.lab import natlab

    why = natlab.available()
    if why:
        raise KafilaError(why)

    async def all_rounds() -> list[natlab.PairResult]:
        out: list[natlab.PairResult] = []
        with natlab.NatLab() as lab:
            for _ in range(max(1, args.rounds)):
                out += await natlab.run_all_pairs(lab, args.link_delay)
        return out

    results = asyncio.run(all_rounds())
    pairs: list[dict[str, Any]] = [
        {
            "a": r.a, "b": r.b, "a_measured": r.a_measured, "b_measured": r.b_measured,
            "predicted": r.predicted, "verified": r.verified, "ready_ms": r.ready_ms,
            "direct_ms": r.direct_ms, "usable": r.echo_ok, "error": r.error, "rtt_ms": r.rtt_ms,
        }
        for r in results
    ]
    right = sum(1 for r in results if r.predicted == r.verified)
    unsafe = sum(1 for r in results if r.predicted == "direct" and r.verified != "direct")
    classified = sum(1 for r in results if r.classified_ok)
    readies = [r.ready_ms for r in results if r.ready_ms is not None]
    summary = {
        "pairs_run": len(results),
        "predictions_right": right,
        "unsafe_errors": unsafe,
        "classified_right": classified,
        "usable": sum(1 for r in results if r.echo_ok),
        "ready_ms_median": statistics.median(readies) if readies else None,
        "ready_ms_max": max(readies) if readies else None,
        "note": "emulated NATs (nftables in network namespaces); no WAN delay",
    }
    report = envelope("nat", {"pairs": pairs, "summary": summary})
    emit(report, args.json, args.out)
    if not args.json:
        t = Table(title="NAT lab (emulated): 9 ordered class pairs")
        for col in ("a", "b", "measured a/b", "predicted", "verified", "ready ms", "direct ms", "usable"):
            t.add_column(col, no_wrap=True)
        for r in results:
            t.add_row(r.a, r.b, f"{r.a_measured}/{r.b_measured}", r.predicted, r.verified,
                      "-" if r.ready_ms is None else f"{r.ready_ms:.1f}",
                      "-" if r.direct_ms is None else f"{r.direct_ms:.1f}", "yes" if r.echo_ok else "NO")
        c = Console(width=None if Console().is_terminal else 120)
        c.print(t)
        c.print(f"predictions right {right}/{len(results)}, unsafe errors {unsafe}, classified right "
                f"{classified}/{len(results)}, ready median {summary['ready_ms_median']} ms "
                f"max {summary['ready_ms_max']} ms")
    return 0 if right == len(results) and unsafe == 0 else 1

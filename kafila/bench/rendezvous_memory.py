"""`kafila bench rendezvous`: the rendezvous's memory, as its table counts it and as the process holds it (issue 56).

The real sans-I/O RendezvousCore, filled in-process as members' clients do (kafila.bench.rendezvous_fill):
sessions of 16 members, each with the largest announcement the rendezvous stores. Two figures, each from a
fresh process of its own, so that what it measures is the rendezvous's alone: bytes per session by tracemalloc
(sessions made once the reply cache and rate-limit buckets are at their bounds) beside what the table counts
for them (rendezvous.state's sizes, which bound the table); and the process's RSS, at its peak, with the table
at the given limits (default: Limits()) full, that is refusing more.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from typing import Any

from kafila.bench.rendezvous_fill import Progress, fill_table, largest_announcement, measure_sample
from rendezvous.limits import Limits

HELP = "the rendezvous's memory: bytes per session of 16 members with the largest announcements, RSS when full"


def configure(p: argparse.ArgumentParser) -> None:
    from kafila.commands._common import positive_int

    lim = Limits()
    p.add_argument("--max-table-mb", type=positive_int, default=lim.max_table_bytes >> 20,
                   help=f"the table's bytes bound, MiB (default {lim.max_table_bytes >> 20}, the rendezvous's)")
    p.add_argument("--max-sessions", type=positive_int, default=lim.max_sessions,
                   help=f"the table's sessions bound (default {lim.max_sessions:,}, the rendezvous's)")
    # the reply cache (8,192 replies) and the rate-limit buckets (20,000, 4 a member) are full after about 320
    # sessions; a sample as long as the warm-up sees each of the table's dicts grow once (amortized, not a spike)
    p.add_argument("--sample", type=positive_int, default=400, help="sessions tracemalloc measures (default 400)")
    p.add_argument("--warmup", type=int, default=400,
                   help="sessions made first, filling the reply cache and rate-limit buckets (default 400)")
    p.add_argument("--spent", action="store_true",
                   help="every member also spends the 8 re-join nonces its record keeps at most (wrong MACs)")


def _child(kind: str, kwargs: dict[str, Any], conn: Connection) -> None:
    """One measurement in this fresh process; its progress and result (or error) go back on `conn`."""
    try:
        if kind == "sample":
            result = measure_sample(**kwargs)
        else:
            result = fill_table(**kwargs, progress=lambda size, n: conn.send(("progress", size, n)))
        conn.send(("done", result))
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def in_fresh_process(kind: str, kwargs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
    """`measure_sample` ("sample") or `fill_table` ("fill") run in a fresh process: its RSS is theirs alone."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(kind, kwargs, theirs), daemon=True)
    proc.start()
    theirs.close()  # ours then reads EOF if the child dies
    try:
        while True:
            try:
                msg = ours.recv()
            except EOFError:
                raise RuntimeError(f"the {kind} process ended without a result") from None
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], msg[2])
            elif msg[0] == "error":
                raise RuntimeError(f"the {kind} process failed: {msg[1]}")
            else:
                return dict(msg[1])
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()


def rendezvous_memory(limits: Limits, sample: int, warmup: int, spent: bool = False,
                      progress: Progress | None = None) -> dict[str, Any]:
    """Both figures (see the module), the sample measured at the default limits with the caps lifted so that
    it fits, the fill at `limits`."""
    ann = "Q" * largest_announcement(limits)
    roomy = replace(Limits(), max_table_bytes=1 << 40, max_sessions=1 << 30)
    measured = in_fresh_process("sample", {"limits": roomy, "ann": ann, "warmup": warmup, "sessions": sample,
                                           "spent": spent})
    full = in_fresh_process("fill", {"limits": limits, "ann": ann, "spent": spent}, progress)
    return {"limits": {k: v for k, v in asdict(limits).items() if k.startswith("max_")},
            "members_per_session": 16, "announcement_chars": len(ann), "spent_nonces": spent,
            "sample": measured, "full": full}


def summary(r: dict[str, Any]) -> str:
    """The two figures in a sentence, as the README and docs/security.md quote them."""
    s, f = r["sample"], r["full"]
    return (f"A session of 16 members with {r['announcement_chars']}-character announcements counts "
            f"{s['counted_bytes_per_session'] / 1e3:.1f} kB and holds {s['held_bytes_per_session'] / 1e3:.1f} kB "
            f"(tracemalloc, {s['sessions']} sessions); the table full at {r['limits']['max_table_bytes'] >> 20} MiB "
            f"and {r['limits']['max_sessions']:,} sessions held {f['sessions']:,} sessions ({f['bound']} bound), "
            f"{f['rss_bytes_per_session'] / 1e3:.1f} kB of RSS each, the process at {f['peak_rss_kb'] / 1024:.0f} MiB "
            f"at its peak (filled in {f['seconds']:.0f} s)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kafila.bench.report import emit, envelope

    limits = replace(Limits(), max_table_bytes=args.max_table_mb << 20, max_sessions=args.max_sessions)
    console = Console(stderr=True)
    console.log(f"measuring {args.sample} sessions after {args.warmup} (tracemalloc), then filling the table")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[what]}"),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("filling the table", total=1.0, what="")

        def progress(size: int, n: int) -> None:
            done = max(size / limits.max_table_bytes, n / limits.max_sessions)
            bar.update(task, completed=min(done, 1.0), what=f"{n:,} sessions, {size / (1 << 20):.0f} MiB counted")

        results = rendezvous_memory(limits, args.sample, args.warmup, args.spent, progress)
        bar.update(task, completed=1.0)  # full: the table refused more, short of its bound by less than a member
    results["summary"] = summary(results)
    emit(envelope("rendezvous", results), args.json, args.out)
    if not args.json:
        Console().print(results["summary"])
    return 0

"""`kafila bench planner`: how long planning takes, and Kafila's split against the two baselines.

(a) Planning time of `make_plan` on synthetic fleets of m = 5 and 8 members and models of
k = 32, 64 and 80 blocks of unequal size, in two NAT mixes: "mixed" (random classes, so few
orders tie on ring cost) and "all-relay" (every member unknown, so every order ties and the
partition must break the tie: the worst case). Median of `repeats` runs, wall clock.

(b) The fleets and models shipped in bench/ (three fleets: one LAN, one region, two
continents; Qwen3-8B/14B/32B at Q4_K_M, and the MoE and sliding-window models Qwen3-30B-A3B,
gpt-oss-20b and Gemma 3 27B) at C concurrent requests of T tokens: bottleneck and utilisation of
Kafila's plan, the uniform split and the memory-proportional split on the same ring, whether each
places the model, and what the model keeps resident and reads per decode call at batch C.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from kafila.bench.report import emit, envelope
from kafila.errors import KafilaError

HELP = "planning time for 5 and 8 members, and Kafila's split against uniform and memory-proportional"
BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
FLEETS = ("lan", "region", "continents")
MODELS = ("qwen3-8b-q4_k_m", "qwen3-14b-q4_k_m", "qwen3-32b-q4_k_m", "qwen3-30b-a3b-q4_k_m", "gpt-oss-20b-mxfp4",
          "gemma3-27b-q4_k_m")
TARGET_S = 1.0  # the target for m = 8, k = 80


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="fewer timing cases and one run each (for tests)")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent requests for part (b) (default 4)")
    p.add_argument("--context", type=int, default=4096, help="tokens per request for part (b) (default 4096)")
    p.add_argument("--bench-dir", default=None, help="folder with fleet-*.json and qwen3-*.json (default: bench/)")


def synthetic(m: int, k: int, nat_mix: str, seed: int) -> tuple[Any, Any]:
    """A heterogeneous fleet and a model with Q4_K_M-like unequal blocks, reproducible from the seed."""
    from kafila.planner import Member, ModelSpec, NatClass

    rng = random.Random(seed)
    classes = list(NatClass)
    members = tuple(
        Member(
            name=f"member-{i}",
            bandwidth=rng.uniform(20e9, 800e9),
            dispatch_s=rng.uniform(0.15e-3, 1.5e-3),
            memory=int(rng.uniform(5e9, 24e9)),
            rtt_ms=round(rng.uniform(5, 120), 1),
            nat=NatClass.UNKNOWN if nat_mix == "all-relay" else rng.choice(classes),
        )
        for i in range(m)
    )
    # Two block sizes as in Q4_K_M (some layers carry Q6_K tensors), plus a little jitter.
    blocks = tuple(int((0.42e9 if rng.random() < 0.4 else 0.36e9) * rng.uniform(0.97, 1.03)) for _ in range(k))
    model = ModelSpec("synthetic", blocks, (4096,) * k, unembed_bytes=int(0.62e9), head_bytes=int(1.0e9))
    return members, model


def timing(quick: bool) -> list[dict[str, Any]]:
    """Part (a): planning time per (m, k, NAT mix)."""
    from kafila.planner import Workload, make_plan

    cases = [(5, 32), (8, 80)] if quick else [(m, k) for m in (5, 8) for k in (32, 64, 80)]
    repeats = 1 if quick else 3
    rows = []
    for m, k in cases:
        for mix in ("mixed", "all-relay"):
            members, model = synthetic(m, k, mix, seed=1000 * m + k)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                plan = make_plan(members, model, Workload(1, 4096))
                times.append(time.perf_counter() - t0)
            rows.append(
                {
                    "members": m,
                    "blocks": k,
                    "nat_mix": mix,
                    "seconds": statistics.median(times),
                    "runs": repeats,
                    "feasible": plan.feasible,
                }
            )
    return rows


def fleets(bench_dir: Path, concurrency: int, context: int) -> list[dict[str, Any]]:
    """Part (b): every shipped fleet × model, three strategies each."""
    from kafila.errors import PlanInputError
    from kafila.planner import Workload, make_plan
    from kafila.planner.cost import kv_positions, read_bytes
    from kafila.planner.files import load_fleet, load_model

    rows = []
    for fleet in FLEETS:
        members = load_fleet(str(bench_dir / f"fleet-{fleet}.json"))
        for model_name in MODELS:
            model = load_model(str(bench_dir / f"{model_name}.json"))
            wl = Workload(concurrency, context)
            row: dict[str, Any] = {
                "fleet": fleet, "model": model.name,
                "resident_bytes": model.weight_bytes(),
                "kv_cache_bytes": sum(t * kv for t, kv in zip(kv_positions(model, wl), model.kv_bytes_per_token,
                                                              strict=True)),
                "read_bytes_per_call": {"1": sum(read_bytes(model, 1)),
                                        str(concurrency): sum(read_bytes(model, concurrency))},
            }
            try:
                plan = make_plan(members, model, wl)
            except PlanInputError as exc:  # a model the fleet cannot share at all (e.g. one that runs only whole)
                row["refused"] = str(exc)
                rows.append(row)
                continue
            for s in ("kafila", "uniform", "memory"):
                p = plan.placement(s)
                row[s] = {
                    "feasible": p.feasible,
                    "bottleneck_seconds": p.bottleneck_seconds,
                    "utilisation": p.utilisation,
                    "reason": p.reason,
                }
            row["max_context"] = max_context(members, model, plan, concurrency)
            k = plan.kafila.bottleneck_seconds
            for s in ("uniform", "memory"):
                b = plan.placement(s).bottleneck_seconds
                row[f"{s}_over_kafila"] = None if not (k and b) else b / k
            rows.append(row)
    return rows


def max_context(members: Any, model: Any, plan: Any, concurrency: int) -> dict[str, int]:
    """Longest context per request that each strategy places with `concurrency` requests (0: none).

    Kafila: the exact memory test over every order (time ignored), bisected on T. Baselines: their
    block counts do not depend on T, so each member's spare memory over its KV bytes per token.
    """
    from kafila.planner import Workload
    from kafila.planner.cost import make_ctx
    from kafila.planner.partition import OrderSet, fits

    ms = tuple(sorted(members, key=lambda mem: mem.name))
    lo, hi = 0, 1 << 22
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(make_ctx(ms, model, Workload(concurrency, mid)), OrderSet()):
            lo = mid
        else:
            hi = mid - 1
    out = {"kafila": lo}
    by_name = {mem.name: mem for mem in members}
    for s in ("uniform", "memory"):
        p = plan.placement(s)
        if not p.ranges:
            out[s] = 0
            continue
        def placed(t: int, p: Any = p) -> bool:
            ctx = make_ctx(ms, model, Workload(concurrency, t))
            return all(ctx.need(a, e, name == p.head) <= by_name[name].memory for name, (a, e) in p.ranges.items())

        lo, hi = 0, 1 << 22
        while lo < hi:  # a member's need grows with T (window layers stop growing past their window)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if placed(mid) else (lo, mid - 1)
        out[s] = lo
    return out


def run(args: argparse.Namespace) -> int:
    bench_dir = Path(args.bench_dir) if args.bench_dir else BENCH_DIR
    if not (bench_dir / "fleet-lan.json").is_file():
        raise KafilaError(f"bench files not found in {bench_dir}; pass --bench-dir")
    t_rows = timing(args.quick)
    f_rows = fleets(bench_dir, args.concurrency, args.context)
    worst = [r["seconds"] for r in t_rows if r["members"] == 8 and r["blocks"] == 80]
    report = envelope(
        "planner",
        {
            "measured": (
                "(a) wall-clock seconds of make_plan (exact order search, partition, head rotation, baselines), "
                "median of the runs, on seeded synthetic fleets with unequal Q4_K_M-like blocks; 'all-relay' makes "
                "every ring order tie, the worst case. (b) bench/ fleets x models (Qwen3 dense, Qwen3-30B-A3B and "
                "gpt-oss-20b MoE, Gemma 3 27B with sliding windows): slowest stage time "
                "(bottleneck) and utilisation (sum of stage times / (members x bottleneck)) of each strategy on the "
                f"same ring, and whether it places the model with {args.concurrency} concurrent requests of "
                f"{args.context} tokens (weights + KV cache + head tensors within each member's memory); "
                f"max_context: the longest context per request each strategy places with {args.concurrency} requests."
            ),
            "workload": {"concurrency": args.concurrency, "context": args.context},
            "target_seconds_m8_k80": TARGET_S,
            "target_met": bool(worst) and max(worst) < TARGET_S,
            "timing": t_rows,
            "fleets": f_rows,
        },
    )
    emit(report, args.json, args.out, args.plot)
    if not args.json:
        _print(report)
    return 0


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="(a) planning time (median wall clock)")
    for col in ("members", "blocks", "NAT mix", "seconds"):
        t.add_column(col, justify="right")
    for r in report["timing"]:
        t.add_row(str(r["members"]), str(r["blocks"]), r["nat_mix"], f"{r['seconds']:.3f}")
    console.print(t)
    wl = report["workload"]
    f = Table(title=f"(b) slowest stage ms / utilisation / places it? — {wl['concurrency']} × {wl['context']} tokens")
    for col in ("fleet", "model", "kafila", "uniform", "memory", "uniform ÷ kafila", "memory ÷ kafila", "max T k/u/m"):
        f.add_column(col, justify="left" if col in ("fleet", "model") else "right")
    refused: dict[str, str] = {}
    for r in report["fleets"]:
        cells = [r["fleet"], r["model"]]
        if "refused" in r:
            f.add_row(*cells, "[red]refused[/] (below)", "", "", "", "", "")
            refused[r["model"]] = r["refused"]
            continue
        for s in ("kafila", "uniform", "memory"):
            p = r[s]
            if p["bottleneck_seconds"] is None:
                cells.append("cannot place")
            else:
                fits = "" if p["feasible"] else " [red]no fit[/]"
                cells.append(f"{p['bottleneck_seconds'] * 1000:.1f} / {p['utilisation']:.0%}{fits}")
        for s in ("uniform", "memory"):
            ratio = r[f"{s}_over_kafila"]
            cells.append("—" if ratio is None else f"{ratio:.1f}×")
        mc = r["max_context"]
        cells.append(f"{mc['kafila']}/{mc['uniform']}/{mc['memory']}")
        f.add_row(*cells)
    console.print(f)
    for reason in refused.values():
        console.print(f"refused: {reason}")
    c = report["workload"]["concurrency"]
    m = Table(title=f"model bytes: resident, KV cache for {wl['concurrency']} × {wl['context']} tokens, read per "
                    f"decode call at batch 1 and {c}")
    for col in ("model", "resident GB", "KV GB", "read GB @1", f"read GB @{c}"):
        m.add_column(col, justify="left" if col == "model" else "right")
    seen: set[str] = set()
    for r in report["fleets"]:
        if r["model"] in seen:
            continue
        seen.add(r["model"])
        reads = r["read_bytes_per_call"]
        m.add_row(r["model"], f"{r['resident_bytes'] / 1e9:.2f}", f"{r['kv_cache_bytes'] / 1e9:.2f}",
                  f"{reads['1'] / 1e9:.2f}", f"{reads[str(c)] / 1e9:.2f}")
    console.print(m)
    console.print(report["measured"], style="dim")

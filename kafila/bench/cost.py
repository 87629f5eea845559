"""`kafila bench cost`: the planner's stage-time model against measured decode calls, at real block sizes.

One fresh probe fits o + n·p + bytes/b (DESIGN §2c) on its own cuts. Then, with the same timing method
(cold caches, idle waits: `time_cases`), this measures cuts the fit never saw: of the embedded
SmolLM2-135M (2.2 MB blocks) and of random-weight files with Llama-3.1-8B's blocks (123 MB, `--blocks`
of them) and Qwen3-32B's (274 MB, `--blocks-32b`), and compares each with the three-term prediction and
with the two-term `o + bytes/b` fitted on the small cuts alone (the old model). Head cuts too: the
embedded model's last 6 blocks with its output layer, and one Qwen3-32B block with a real 151,936-token
output matrix (437 MB; the probe fitted the unembedding on 30 MB and 295 MB ones), against the probe's
unembedding fit and against the unembedding timed on the small model's output alone (the old probe's).
With `--moe` it also
times one random-weight block of Qwen3-30B-A3B's shape (128 experts, 8 per token, Q4_0) and of
gpt-oss-20b's (32 experts, 4 per token, MXFP4 experts and Q8_0 attention, sinks, a window) at decode batches
1 and 4 against the planner's MoE bytes (dense tensors plus the expected distinct experts,
kafila.planner.cost), and the 8B-shaped dense block at both batches for reference. All cases are timed
in the same rounds, and each block is predicted from the probe and from the three terms fitted on those
rounds' cuts in wall and in CPU time (which other programs' load cannot bend), and each MoE block's
prefill by part (kafila.bench.moe_prefill).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

HELP = "cost model: predicted vs measured stage times on small- and large-block cuts (and MoE blocks)"
SMALL_CUTS = (2, 6, 15, 30)
HEAD_SMALL_BLOCKS = 6  # the embedded model's head cut: its last 6 blocks and output layer (the probe times 1)
MOE_SHAPES = ("qwen3-30b-a3b", "gpt-oss-20b")  # kafila.model.random_gguf.SHAPES
BATCHES = (1, 4)  # decode batches the MoE blocks are timed at


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=20, help="timed decode calls per cut (default 20)")
    p.add_argument("--blocks", type=int, default=4, help="blocks of the 8B-shaped file to cut 1..N of (default 4)")
    p.add_argument("--blocks-32b", type=int, default=2,
                   help="blocks of a Qwen3-32B-shaped file (274 MB each) to cut 1..N of (default 2; 0: none)")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default 0: all cores)")
    p.add_argument("--moe", action=argparse.BooleanOptionalAction, default=True,
                   help="also time Qwen3-30B-A3B- and gpt-oss-20b-shaped MoE blocks at batch 1 and 4 (default on)")


@dataclass(frozen=True)
class CallTime:
    """Median seconds of one case's decode calls: wall clock, and CPU time per llama.cpp thread."""

    wall_s: float
    # Process CPU seconds per call ÷ threads: the wall time the call takes when nothing preempts it.
    # With one thread it is exactly the computing thread's time; with more, barrier spinning counts too.
    cpu_s: float


def time_cases(cases: list[tuple[Any, int]], calls: int, threads: int, warmup: int = 3) -> list[CallTime]:
    """Median wall and CPU seconds of a decode call of `batch` rows (one per sequence) for each (engine, batch).

    Timed as `time_decode_calls` times single rows (cold caches, an idle wait before each call), and
    round-robin over all cases, so that what other programs do to the machine falls on every case alike:
    an MoE block timed in a phase of its own once met another load than the cuts it was compared with.
    The CPU time is recorded because on a shared machine a call's wall time includes the slices the
    scheduler gives to other programs, and a short call after an idle wait loses fewer of them than a
    long one (a waking task is scheduled ahead: under a load of 16 on 2 cores a 3 ms call took 1.0–1.6×
    its CPU time, a 20 ms one 2.5×), which bends wall times against bytes where CPU times stay linear.
    """
    from kafila.engine.call_timing import EVICT_BYTES, IDLE_S
    from kafila.engine.stage import Rows

    rng = np.random.default_rng(0)
    evict = np.ones(EVICT_BYTES // 4, np.float32)
    wall: list[list[float]] = [[] for _ in cases]
    cpu: list[list[float]] = [[] for _ in cases]
    for i in range(warmup + calls):
        for k, (engine, batch) in enumerate(cases):
            x = rng.standard_normal((batch, engine.n_embd)).astype(np.float32)
            rows = Rows(np.arange(batch, dtype=np.int32), np.full(batch, i, np.int32), np.ones(batch, bool))
            evict.max()  # read past the caches, as a member's weights are after its neighbours ran
            time.sleep(IDLE_S)
            t0, c0 = time.perf_counter(), time.process_time()
            engine.run(x, rows)
            if i >= warmup:
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append((time.process_time() - c0) / threads)
    for engine, batch in cases:
        for s in range(batch):
            engine.free(s)
    return [CallTime(statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu, strict=True)]


def _load() -> list[float] | None:
    """The machine's 1/5/15-minute load averages: timings on a busy machine say little (None where unknown)."""
    import os

    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _fit_predict(fit: tuple[float, float, float, float], n_blocks: int, nbytes: int) -> float:
    """Seconds `fit_cost`'s (bandwidth, dispatch, per-block, residual) predicts for a stage."""
    b, o, p, _ = fit
    return o + n_blocks * p + nbytes / b


def _row_rate(batch_rows: list[dict[str, Any]]) -> float | None:
    """Bytes per CPU second of the dense block's rows beyond the first (its batch-4 time over its batch-1 time)."""
    dense = {r["batch"]: r for r in batch_rows if not r["moe"]}
    if 1 not in dense or len(dense) < 2:
        return None
    top = max(dense)
    extra_s = (dense[top]["cpu_ms"] - dense[1]["cpu_ms"]) / 1e3
    return (top - 1) * dense[1]["read_bytes"] / extra_s if extra_s > 0 else None


def _err(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from kafila.bench.report import emit, envelope
    from kafila.engine.probe import fit_cost, fit_unembedding, probe
    from kafila.engine.stage import ContextConfig, StageEngine
    from kafila.model.cut import StageSpec
    from kafila.model.describe import describe_model
    from kafila.model.embedded import resolve_model
    from kafila.model.random_gguf import SHAPES, cached_random_gguf
    from kafila.model.stage_cache import StageCache
    from kafila.planner import ModelSpec
    from kafila.planner.cost import read_bytes

    console = Console(stderr=True)
    cache = StageCache()
    cache_models = cache.root / "probe-models"
    smol = resolve_model(None)
    console.log("probing (fresh): fitting o + n·p + bytes/b on small- and large-block cuts")
    t0 = time.perf_counter()
    fit = probe(smol, cache, threads=args.threads)
    probe_s = time.perf_counter() - t0
    small = [(b, s) for b, s in fit.samples if b < 50e6]  # the embedded model's cuts
    b2, o2, _, _ = fit_cost(small)  # the two-term model on the small cuts alone

    big = cached_random_gguf(SHAPES["llama3-8b"], args.blocks, cache_models, tokenizer=False)
    cuts = [(smol, n) for n in SMALL_CUTS] + [(big, n) for n in range(1, args.blocks + 1)]
    # with its real vocabulary: its head cut's output matrix is one the probe never timed
    larger = [cached_random_gguf(SHAPES["qwen3-32b"], args.blocks_32b, cache_models)] if args.blocks_32b > 0 else []
    cuts += [(path, n) for path in larger for n in range(1, args.blocks_32b + 1)]
    heads = [(smol, HEAD_SMALL_BLOCKS)] + [(path, 1) for path in larger]
    config = ContextConfig(n_ctx_per_seq=256, n_seq_max=4, n_batch=8, n_threads=args.threads)
    infos = {path: describe_model(path) for path in {path for path, _ in cuts + heads}}
    # Decode batches 1 and 4 of one block: each MoE shape, and the 8B-shaped dense block for reference
    # (the model's bytes do not grow with the batch there; what a compute-bound CPU does, this shows).
    batched = [(name, batch) for name in (*(MOE_SHAPES if args.moe else ()), "llama3-8b") for batch in BATCHES]
    specs: dict[str, ModelSpec] = {}
    cases: list[tuple[Any, int]] = []
    try:
        for path, n in cuts:
            console.log(f"loading {path.name} blocks [0, {n})")
            cases.append((StageEngine(cache.stage(path, StageSpec(0, n, head=False)), config, final=False), 1))
        for path, n in heads:
            k = infos[path].n_blocks
            console.log(f"loading {path.name} blocks [{k - n}, {k}) with the output layer")
            cases.append((StageEngine(cache.stage(path, StageSpec(k - n, k, head=True)), config, final=True), 1))
        for name, batch in batched:
            # one block, one context per batch, so every case's sequences start at position 0
            path = big if name == "llama3-8b" else cached_random_gguf(SHAPES[name], 1, cache_models, tokenizer=False)
            specs[name] = ModelSpec.described(describe_model(path))
            console.log(f"loading a {name}-shaped block for decode batch {batch}")
            cases.append((StageEngine(cache.stage(path, StageSpec(0, 1, head=False)), config, final=False), batch))
        console.log(f"timing {args.calls} decode calls of each, round-robin")
        measured = time_cases(cases, args.calls, config.threads)
    finally:
        for engine, _ in cases:
            engine.close()
    cut_times, head_times = measured[:len(cuts)], measured[len(cuts):len(cuts) + len(heads)]
    batch_times = measured[len(cuts) + len(heads):]
    nbytes_of = [sum(infos[path].blocks_bytes[:n]) for path, n in cuts]
    blocks_of = [n for _, n in cuts]
    # The same three terms fitted on these rounds' cuts, in wall and in CPU time: they predict the MoE
    # blocks (which no fit saw) under the load they were timed in, so what is left is the byte model's error.
    wall_fit = fit_cost([(nb, t.wall_s) for nb, t in zip(nbytes_of, cut_times, strict=True)], blocks_of)
    cpu_fit = fit_cost([(nb, t.cpu_s) for nb, t in zip(nbytes_of, cut_times, strict=True)], blocks_of)
    rows: list[dict[str, Any]] = []
    for (path, n), nbytes, t in zip(cuts, nbytes_of, cut_times, strict=True):
        p3 = fit.predict(n, nbytes)
        p2 = o2 + nbytes / b2
        rows.append({"file": path.name, "blocks": n, "bytes": nbytes, "measured_ms": t.wall_s * 1e3,
                     "predicted_ms": p3 * 1e3, "error": _err(p3, t.wall_s),
                     "two_term_predicted_ms": p2 * 1e3, "two_term_error": _err(p2, t.wall_s),
                     "cpu_ms": t.cpu_s * 1e3})

    # the old probe's unembedding speed: from the small model's head cut alone
    small_speed, _ = fit_unembedding(list(fit.unembed_samples[:1]), fit.bandwidth_bytes_per_s)
    head_rows: list[dict[str, Any]] = []
    for (path, n), t in zip(heads, head_times, strict=True):
        info = infos[path]
        body = fit.predict(n, sum(info.blocks_bytes[info.n_blocks - n:]))
        p3 = body + fit.unembed_s + info.unembed_bytes / fit.unembed_bandwidth_bytes_per_s
        p1 = body + info.unembed_bytes / small_speed
        head_rows.append({"file": path.name, "blocks": n, "unembed_bytes": info.unembed_bytes,
                          "measured_ms": t.wall_s * 1e3, "predicted_ms": p3 * 1e3, "error": _err(p3, t.wall_s),
                          "small_vocab_predicted_ms": p1 * 1e3, "small_vocab_error": _err(p1, t.wall_s),
                          "cpu_ms": t.cpu_s * 1e3})

    batch_rows: list[dict[str, Any]] = []
    for (name, batch), t in zip(batched, batch_times, strict=True):
        spec = specs[name]
        nbytes = read_bytes(spec, batch)[0]
        p3 = fit.predict(1, nbytes)
        pw, pc = _fit_predict(wall_fit, 1, nbytes), _fit_predict(cpu_fit, 1, nbytes)
        batch_rows.append({"shape": name, "moe": bool(spec.experts), "batch": batch, "read_bytes": nbytes,
                           "resident_bytes": spec.blocks_bytes[0], "measured_ms": t.wall_s * 1e3,
                           "predicted_ms": p3 * 1e3, "error": _err(p3, t.wall_s),
                           "round_predicted_ms": pw * 1e3, "round_error": _err(pw, t.wall_s),
                           "cpu_ms": t.cpu_s * 1e3, "cpu_predicted_ms": pc * 1e3, "cpu_error": _err(pc, t.cpu_s)})
    moe_rows = [r for r in batch_rows if r["moe"]]
    row_rate = _row_rate(batch_rows)
    for r in batch_rows:
        # What a per-row compute term would add (each row beyond the first multiplies the dense part and
        # its k experts once more than the distinct bytes count), at the rate the dense block showed.
        one_row = read_bytes(specs[r["shape"]], 1)[0]
        extra = r["batch"] * one_row - r["read_bytes"]
        r["cpu_rows_predicted_ms"] = r["cpu_predicted_ms"] + (extra / row_rate * 1e3 if row_rate else 0.0)
        r["cpu_rows_error"] = _err(r["cpu_rows_predicted_ms"], r["cpu_ms"])

    if args.moe and fit.prefill_rows:
        from kafila.bench import moe_prefill

        console.log("timing MoE blocks' prefill calls with 1, k and 4k experts per token")
        parts = moe_prefill.measure(fit, tuple(SHAPES[s] for s in MOE_SHAPES), cache_models, cache, args.threads)
    else:
        parts = []
    stages = rows + head_rows  # every stage time the planner predicts: body cuts and head cuts
    big_errors = [abs(r["error"]) for r in stages if r["file"] != smol.name]
    results = {
        "threads": args.threads,
        "load_average": _load(),
        "measured": ("median seconds of decode calls (cold caches, 20 ms idle before each, as a ring member's "
                     "calls come; all cases round-robin) of cuts the probe did not time; predicted from one fresh "
                     "probe; the MoE block also from the three terms fitted on the same rounds' cuts, in wall "
                     "and in CPU time (CPU: process CPU time per thread, exact with --threads 1)"),
        "probe": {"seconds": probe_s, "dispatch_ms": fit.dispatch_s * 1e3, "block_ms": fit.block_s * 1e3,
                  "bandwidth_gbs": fit.bandwidth_bytes_per_s / 1e9, "fit_residual": fit.fit_residual,
                  "unembed_ms": fit.unembed_s * 1e3, "unembed_gbs": fit.unembed_bandwidth_bytes_per_s / 1e9,
                  "unembed_samples": [{"bytes": b, "ms": u * 1e3} for b, u in fit.unembed_samples],
                  "two_term_small_cuts": {"dispatch_ms": o2 * 1e3, "bandwidth_gbs": b2 / 1e9}},
        "round_fit": {name: {"dispatch_ms": f[1] * 1e3, "block_ms": f[2] * 1e3, "bandwidth_gbs": f[0] / 1e9,
                             "fit_residual": f[3]} for name, f in (("wall", wall_fit), ("cpu", cpu_fit))},
        "cuts": rows,
        "heads": head_rows,
        "batched": batch_rows,
        "row_rate_gbs": row_rate / 1e9 if row_rate else None,
        "moe_prefill": parts,
        "median_abs_error": statistics.median(abs(r["error"]) for r in stages),
        "median_abs_error_large_blocks": statistics.median(big_errors),
        "median_abs_error_two_term_large_blocks": statistics.median(
            abs(r["two_term_error"]) for r in rows if r["file"] != smol.name),
        "median_abs_error_by_file": {
            path.name: statistics.median(abs(r["error"]) for r in stages if r["file"] == path.name)
            for path in dict.fromkeys(path for path, _ in cuts + heads)},
        "target": "median |predicted - measured| / measured <= 10 % (issue 11); MoE within 20 % (issue 12)",
        "target_met": statistics.median(abs(r["error"]) for r in stages) <= 0.10,
        # issue 12's check of the MoE bytes: the Qwen3-30B-A3B-shaped block against the three terms fitted on
        # the same rounds' cuts (the probe's own drift since it ran shows in the cuts' errors, and in "error")
        "moe_target_met": any(m["shape"] == MOE_SHAPES[0] for m in moe_rows)
        and all(abs(m["round_error"]) <= 0.20 for m in moe_rows if m["shape"] == MOE_SHAPES[0]),
    }
    report = envelope("cost", results)
    emit(report, args.json, args.out)
    if not args.json:
        _print(results)
    return 0


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    p = r["probe"]
    console = Console(width=max(Console().width, 120))  # the tables' columns, also when written to a file
    console.print(f"probe ({p['seconds']:.1f} s): {p['dispatch_ms']:.3f} ms per call + {p['block_ms']:.3f} ms per "
                  f"block + bytes / {p['bandwidth_gbs']:.1f} GB/s (fit error {p['fit_residual']:.1%}); two-term on "
                  f"small cuts: {p['two_term_small_cuts']['dispatch_ms']:.3f} ms + bytes / "
                  f"{p['two_term_small_cuts']['bandwidth_gbs']:.1f} GB/s")
    t = Table("file", "blocks", "MB", "measured ms", "predicted ms", "error", "two-term ms", "error",
              title="decode call of a stage: measured vs predicted")
    for c in r["cuts"]:
        t.add_row(c["file"], str(c["blocks"]), f"{c['bytes'] / 1e6:.1f}", f"{c['measured_ms']:.3f}",
                  f"{c['predicted_ms']:.3f}", f"{c['error']:+.1%}", f"{c['two_term_predicted_ms']:.3f}",
                  f"{c['two_term_error']:+.1%}")
    console.print(t)
    h = Table("file", "blocks", "output MB", "measured ms", "predicted ms", "error", "small-vocab ms", "error",
              title="head cut (blocks + unembedding): measured vs predicted, and with the unembedding timed on the "
              "embedded model's output alone")
    for c in r["heads"]:
        h.add_row(c["file"], str(c["blocks"]), f"{c['unembed_bytes'] / 1e6:.1f}", f"{c['measured_ms']:.3f}",
                  f"{c['predicted_ms']:.3f}", f"{c['error']:+.1%}", f"{c['small_vocab_predicted_ms']:.3f}",
                  f"{c['small_vocab_error']:+.1%}")
    console.print(h)
    if r["batched"]:
        m = Table("block", "batch", "read MB", "wall ms", "probe", "error", "same rounds", "error", "CPU ms",
                  "CPU fit", "error", "+ rows", "error", title="one block at decode batch 1 and 4: measured vs "
                  "predicted (probe; wall and CPU fits on the same rounds' cuts; + rows: with a per-row term)")
        for row in r["batched"]:
            m.add_row(row["shape"], str(row["batch"]), f"{row['read_bytes'] / 1e6:.1f}", f"{row['measured_ms']:.2f}",
                      f"{row['predicted_ms']:.2f}", f"{row['error']:+.1%}", f"{row['round_predicted_ms']:.2f}",
                      f"{row['round_error']:+.1%}", f"{row['cpu_ms']:.2f}", f"{row['cpu_predicted_ms']:.2f}",
                      f"{row['cpu_error']:+.1%}", f"{row['cpu_rows_predicted_ms']:.2f}",
                      f"{row['cpu_rows_error']:+.1%}")
        console.print(m)
        if r["row_rate_gbs"]:
            console.print(f"per-row term: rows beyond the first at {r['row_rate_gbs']:.1f} GB/s of the bytes they "
                          f"multiply (the dense block's batch-{max(BATCHES)} CPU time over its batch-1 time)")
        console.print(f"{MOE_SHAPES[0]} within 20 % of the same rounds' wall-time fit at batch "
                      f"{' and '.join(map(str, BATCHES))}: {r['moe_target_met']}")
    if r["moe_prefill"]:
        from kafila.bench.moe_prefill import table

        console.print(table(r["moe_prefill"]))
    console.print(f"load average {r['load_average']}, threads {r['threads'] or 'all'}")
    console.print(f"median |error|: {r['median_abs_error']:.1%} over all cuts and heads, "
                  f"{r['median_abs_error_large_blocks']:.1%} on large blocks "
                  f"(two-term model: {r['median_abs_error_two_term_large_blocks']:.1%}); by file: "
                  + ", ".join(f"{name} {e:.1%}" for name, e in r["median_abs_error_by_file"].items())
                  + f". Target met: {r['target_met']}")

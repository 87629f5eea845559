"""`kafila bench engine`: decode speed of the local chain against one llama.cpp context on the whole file."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

HELP = "decode tokens/s: one llama.cpp context vs the local chain with 1, 2 and 3 stages"
SPLITS = {"chain-1": "", "chain-2": "15", "chain-3": "10,20"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2-135M)")
    p.add_argument("--tokens", type=int, default=48, help="decode steps per round (default 48)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all configurations (default 3)")


def _decode_seconds(forward: Callable[[np.ndarray, object], np.ndarray], rows_for: Callable[[int], object],
                    prompt: list[int], steps: int) -> list[float]:
    """Per-token seconds of `steps` greedy decode calls after a prompt (prefill not timed)."""
    from kafila.engine.stage import Rows

    n = len(prompt)
    want = np.zeros(n, bool)
    want[-1] = True
    logits = forward(np.array(prompt, np.int32), Rows(np.zeros(n, np.int32), np.arange(n, dtype=np.int32), want))
    times = []
    for i in range(steps):
        token = np.array([int(np.argmax(logits[-1]))], np.int32)
        t0 = time.perf_counter()
        logits = forward(token, rows_for(n + i))
        times.append(time.perf_counter() - t0)
    return times


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kafila.bench.report import emit, envelope
    from kafila.engine.chain import open_chain
    from kafila.engine.probe import memory_read_bandwidth, probe
    from kafila.engine.reference import ReferenceContext
    from kafila.engine.stage import ContextConfig, Rows
    from kafila.model.describe import describe_model
    from kafila.model.embedded import resolve_model
    from kafila.model.stage_cache import StageCache

    model = resolve_model(args.model)
    info = describe_model(model)
    cache = StageCache()
    config = ContextConfig(n_ctx_per_seq=512, n_seq_max=1, n_batch=64)
    console = Console(stderr=True)

    def rows_for(pos: int) -> Rows:
        return Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool))

    single = ReferenceContext(model, config)
    chains = {name: open_chain(model, split, config, cache) for name, split in SPLITS.items()}
    forwards: dict[str, Callable] = {"single": single.run, **{k: c.forward for k, c in chains.items()}}
    frees: dict[str, Callable[[int], None]] = {"single": single.free, **{k: c.free for k, c in chains.items()}}
    prompt = chains["chain-1"].vocab.tokenize("The history of the printing press")
    samples: dict[str, list[float]] = {k: [] for k in forwards}
    try:
        for r in range(args.rounds):
            for name, forward in forwards.items():
                console.log(f"round {r + 1}/{args.rounds}: {name}")
                samples[name] += _decode_seconds(forward, rows_for, prompt, args.tokens)
                frees[name](0)
    finally:
        single.close()
        for c in chains.values():
            c.close()
    console.log("measuring memory bandwidth for the physical limit")
    read_bw = memory_read_bandwidth()
    stage_bw = probe(model, cache).bandwidth_bytes_per_s
    bytes_per_token = sum(info.blocks_bytes) + info.unembed_bytes
    limit = read_bw / bytes_per_token
    tps = {k: 1.0 / statistics.median(v) for k, v in samples.items()}
    results = {
        "model": info.name,
        "decode_tokens": args.tokens * args.rounds,
        "tokens_per_s": tps,
        "ms_per_token": {k: 1e3 / v for k, v in tps.items()},
        "ratio_to_single": {k: tps[k] / tps["single"] for k in SPLITS},
        "bytes_per_token": bytes_per_token,
        "memory_read_bytes_per_s": read_bw,
        "stage_bandwidth_bytes_per_s": stage_bw,
        "physical_limit_tokens_per_s": limit,
        "target": "chain-3 keeps >= 0.9x the single context's tokens/s",
        "target_met": tps["chain-3"] / tps["single"] >= 0.9,
    }
    report = envelope("engine", results)
    emit(report, args.json, args.out)
    if not args.json:
        table = Table("configuration", "tokens/s", "ms/token", "× single", "of physical limit",
                      title=f"decode, {info.name} (median of {args.tokens * args.rounds} tokens each)")
        for k, v in tps.items():
            ratio = "" if k == "single" else f"{v / tps['single']:.3f}"
            table.add_row(k, f"{v:.1f}", f"{1e3 / v:.2f}", ratio, f"{v / limit:.0%}")
        Console().print(table)
        Console().print(f"physical limit: {bytes_per_token / 1e6:.1f} MB read per token at "
                        f"{read_bw / 1e9:.1f} GB/s (raw memory read) = {limit:.0f} tokens/s; the engine's "
                        f"effective stage bandwidth is {stage_bw / 1e9:.2f} GB/s. Target met: {results['target_met']}")
    return 0

"""`kafila probe`: measure this machine for the planner with the real engine."""

from __future__ import annotations

import argparse
import json

from kafila.commands._common import add_model_arg

HELP = "measure this machine: stage bandwidth, dispatch overhead, prefill speed, usable memory"


def configure(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")
    p.add_argument("--calls", type=int, default=20, help="timed decode calls per cut (default 20)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from kafila.engine.probe_process import probe_isolated
    from kafila.model.embedded import resolve_model
    from kafila.model.stage_cache import StageCache

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("probing", total=None)

        def step(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        result = probe_isolated(resolve_model(args.model), StageCache(), on_step=step, calls=args.calls)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
        return 0
    out = Console()
    out.print(f"[bold]bandwidth[/]        {result.bandwidth_bytes_per_s / 1e9:.2f} GB/s (effective, fitted)")
    out.print(f"[bold]dispatch[/]         {result.dispatch_s * 1e3:.3f} ms per stage call")
    out.print(f"[bold]per block[/]        {result.block_s * 1e3:.3f} ms per block per call (besides its bytes)")
    out.print(f"[bold]unembedding[/]      {result.unembed_s * 1e3:.3f} ms + bytes at "
              f"{result.unembed_bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    for b, s in result.unembed_samples:
        out.print(f"  {b / 1e6:8.1f} MB output matrix: {s * 1e3:7.3f} ms of its head cut's decode call")
    out.print(f"[bold]usable memory[/]    {result.memory_bytes / 1e9:.2f} GB "
              f"(available {result.available_bytes / 1e9:.2f} GB − runtime "
              f"{result.runtime_overhead_bytes / 1e6:.0f} MB − 10% margin)")
    for (b, s), n in zip(result.samples, result.sample_blocks, strict=True):
        out.print(f"  {n:3d} blocks, {b / 1e6:8.1f} MB stage: {s * 1e3:7.3f} ms per decode call "
                  f"(fit {result.predict(n, b) * 1e3:7.3f} ms)")
    out.print(f"  fit error {result.fit_residual:.1%}")
    if result.prefill_rows:
        out.print(f"[bold]prefill[/]          {result.prefill_dispatch_s * 1e3:.1f} ms + "
                  f"{result.prefill_block_s * 1e3:.1f} ms per block + bytes at "
                  f"{result.prefill_bandwidth_bytes_per_s / 1e9:.3f} GB/s per call of {result.prefill_rows} rows")
        for (b, s), n in zip(result.prefill_samples, result.prefill_sample_blocks, strict=True):
            out.print(f"  {n:3d} blocks, {b / 1e6:8.1f} MB stage: {s * 1e3:9.1f} ms per prefill call "
                      f"(fit {result.predict_prefill(n, b) * 1e3:9.1f} ms)")
        out.print(f"  fit error {result.prefill_fit_residual:.1%}")
        # in a unit people can picture: a 4096-wide (32 heads × 128) block's row attending to 1,000 positions
        out.print(f"  attention to earlier positions: {result.prefill_attn_s * 1e12:.2f} ps per row, position and "
                  f"unit of attention width ({result.prefill_attn_s * 1000 * 32 * 256 * 1e6:.1f} µs per row of "
                  "a 32-head, 128-wide block over 1,000 positions)")
        for (kind, routed, dense, seconds), (_, rate) in zip(result.expert_samples, result.expert_rates, strict=True):
            out.print(f"  routed {kind} experts: {routed / 1e6:.1f} MB of experts × used per row beside "
                      f"{dense / 1e6:.1f} MB dense took {seconds * 1e3:.1f} ms per call: "
                      + (f"{rate / 1e9:.3f} GB/s" if rate else "no slower than dense (the dense rate applies)"))
    return 0

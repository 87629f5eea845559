"""`kafila inspect`: what the planner and engine see in a GGUF model."""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "describe a GGUF model: architecture, blocks, per-block bytes, KV bytes, head bytes"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="GGUF file (default: the embedded SmolLM2-135M)")
    p.add_argument("--json", action="store_true", help="print JSON (the planner's model-file schema and more)")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def _kv_rows(info: Any) -> list[tuple[str, str]]:
    """KV cache per token; sliding-window layers attend to their window, but their cache holds the whole context
    (llama.cpp's swa_full, which the stage engine keeps; the planner reserves that)."""
    total = f"{sum(info.kv_bytes_per_token):,} bytes per token (all blocks, f16)"
    windows = info.kv_window
    if not any(windows):
        return [("KV cache", total)]
    local = sum(1 for w in windows if w)
    return [("KV cache", f"{total}; the {local} sliding-window blocks attend to at most {info.window_tokens} "
                         "tokens, but keep the whole context in their cache")]


def _moe_rows(info: Any) -> list[tuple[str, str]]:
    """Experts: all resident, a few read per token (the expected distinct ones for a decode batch)."""
    if not info.experts:
        return []
    from kafila.planner import ModelSpec
    from kafila.planner.cost import read_bytes

    spec = ModelSpec.described(info)
    return [
        ("experts", f"{info.experts} per block, {info.experts_used} used per token; one expert "
                    f"{_mb(max(info.expert_bytes))}"),
        ("read per call", f"{_mb(sum(read_bytes(spec, 1)))} at batch 1, {_mb(sum(read_bytes(spec, 4)))} at batch 4 "
                          f"(of {_mb(sum(info.blocks_bytes))} resident in the blocks)"),
    ]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kafila.model.describe import describe_model
    from kafila.model.embedded import resolve_model

    info = describe_model(resolve_model(args.model))
    if args.json:
        print(json.dumps(info.as_dict(), indent=2))
        return 0
    summary = Table.grid(padding=(0, 2))
    for key, value in [
        ("model", info.name), ("file", f"{info.path.name} ({_mb(info.file_bytes)})"),
        ("architecture", info.arch), ("quantisation", info.quant), ("blocks", str(info.n_blocks)),
        ("width", f"{info.n_embd} ({info.n_head} heads)"), ("context", f"{info.context_length} tokens"),
        ("vocabulary", f"{info.vocab_size} tokens"),
        ("blocks total", _mb(sum(info.blocks_bytes))),
        ("head resident",
         f"{_mb(info.head_bytes)} (embedding{' = output, tied' if info.tied_output else ' + output'})"),
        ("unembedding", f"{_mb(info.unembed_bytes)} read per token"),
        *_kv_rows(info),
        *_moe_rows(info),
    ]:
        summary.add_row(f"[bold]{key}[/]", value)
    console = Console()
    console.print(summary)
    sizes = sorted(set(info.blocks_bytes))
    if len(sizes) > 1:
        table = Table("block", "weights", "KV bytes/token", title="per block")
        for i, (b, kv) in enumerate(zip(info.blocks_bytes, info.kv_bytes_per_token, strict=True)):
            table.add_row(str(i), _mb(b), f"{kv:,}")
        console.print(table)
    else:
        console.print(f"every block: {_mb(sizes[0])} of weights, {info.kv_bytes_per_token[0]:,} KV bytes per token")
    return 0

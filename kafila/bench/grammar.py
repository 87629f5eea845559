"""`kafila bench grammar`: what grammar-constrained sampling costs a token on the demo ring.

Greedy replies on a 3-member demo ring (processes, QUIC over loopback), each prompt answered plainly and under
a JSON schema (`response_format`), the two kinds taken in turn so the shared machine's drift falls on both;
speculation off, so a token is one trip round the ring either way. The figure is the mean time per token after
the first (the head's `tokens_per_s`, which the occasional whole-vocabulary constraint is counted in), the
median gap beside it, and the median ratio of each prompt's two back-to-back replies (the least drift). The
target: constrained at most 10 % slower.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

HELP = "time per token of JSON-schema-constrained replies against plain ones on the demo ring"
PROMPTS = ["Describe a recipe for a simple soup.", "Describe a small town and its people.",
           "Plan a three-day trip to the mountains.", "Describe a new board game and its rules."]
# long enough that a greedy reply runs to max_tokens under the schema as it does without it
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["title", "summary", "steps", "notes"],
          "properties": {"title": {"type": "string"}, "summary": {"type": "string"},
                         "steps": {"type": "array", "items": {"type": "string"}, "minItems": 6},
                         "notes": {"type": "array", "items": {"type": "string"}, "minItems": 4}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "plan", "schema": SCHEMA, "strict": True}}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=96, help="tokens per reply (default 96)")
    p.add_argument("--rounds", type=int, default=3, help="times through the prompts (default 3)")


async def _timed(url: str, prompt: str, tokens: int, constrained: bool) -> dict[str, Any]:
    from kafila.bench.replies import chat

    extra: dict[str, Any] = {"speculate": "off"} | ({"response_format": FORMAT} if constrained else {})
    r = await chat(url, prompt, tokens, **extra)
    n, rate = int(r.stats.get("completion_tokens") or 0), r.stats.get("tokens_per_s")
    return {"tokens": n, "mean_ms": 1e3 / rate if rate else None,
            "median_ms": r.stats.get("token_interval_median_ms"), "text": r.text[:80]}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Token-weighted mean ms per token over the runs, and the median of their median gaps."""
    timed = [r for r in runs if r["mean_ms"] and r["tokens"] > 1]
    weight = sum(r["tokens"] - 1 for r in timed)
    return {"replies": len(timed), "tokens": sum(r["tokens"] for r in timed),
            "mean_ms_per_token": sum(r["mean_ms"] * (r["tokens"] - 1) for r in timed) / weight if weight else None,
            "median_ms_per_token": statistics.median(r["median_ms"] for r in timed) if timed else None}


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from kafila.bench.report import emit, envelope
    from kafila.errors import SessionError
    from kafila.session.launch.demo import DemoMember, DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread

    console = Console(stderr=True)
    members = tuple(DemoMember(n) for n in ("ada", "bo", "cy"))
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "constrained": []}
    opts = DemoOptions(members=members, strategy="kafila", api_port=0, context=1024)
    with SessionThread(lambda state: run_demo(opts, state)) as s:
        state = s.wait_settled(600)
        if state.phase != "admitted":
            raise SessionError(f"the bench ring was not admitted: {state.rejection}")
        url = state.api_url or ""
        for kind in runs:  # warm-up, both kinds
            asyncio.run(_timed(url, PROMPTS[0], 8, kind == "constrained"))
        for i in range(args.rounds):
            for j, prompt in enumerate(PROMPTS):
                for kind in sorted(runs, reverse=(i + j) % 2 == 1):
                    r = asyncio.run(_timed(url, prompt, args.tokens, kind == "constrained"))
                    runs[kind].append(r)
                    console.log(f"{kind:>11}: {r['tokens']} tokens, {r['mean_ms'] or 0:.2f} ms/token")
    plain, constrained = _summary(runs["plain"]), _summary(runs["constrained"])
    ratio = (constrained["mean_ms_per_token"] / plain["mean_ms_per_token"]
             if constrained["mean_ms_per_token"] and plain["mean_ms_per_token"] else None)
    median_ratio = (constrained["median_ms_per_token"] / plain["median_ms_per_token"]
                    if constrained["median_ms_per_token"] and plain["median_ms_per_token"] else None)
    # each prompt's two replies ran back to back: their ratio sees the least of the shared machine's drift
    paired = [c["mean_ms"] / p["mean_ms"] for p, c in zip(runs["plain"], runs["constrained"], strict=True)
              if c["mean_ms"] and p["mean_ms"]]
    results = {"plain": plain, "constrained": constrained, "ratio": ratio, "median_ratio": median_ratio,
               "paired_median_ratio": statistics.median(paired) if paired else None,
               "target": "constrained <= 1.10x plain (mean ms per token)",
               "target_met": ratio is not None and ratio <= 1.10, "schema": SCHEMA, "runs": runs}
    emit(envelope("grammar", results), args.json, args.out)
    if not args.json:
        Console().print(f"plain {plain['mean_ms_per_token']:.2f} ms/token, constrained "
                        f"{constrained['mean_ms_per_token']:.2f} ms/token: ratio {ratio:.3f} (target <= 1.10); "
                        f"medians {median_ratio:.3f}; back-to-back pairs {results['paired_median_ratio']:.3f}")
    return 0

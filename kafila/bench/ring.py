"""`kafila bench ring`: the loopback ring against one llama.cpp context, and Kafila's split against the baselines.

(a) decode latency per token of a 3-member ring (no slow-down) against one local context, and of
    the same stages joined by OS pipes (what this machine allows without a network stack);
(b) aggregate throughput with 1 and 4 concurrent users on an emulated heterogeneous fleet, for
    Kafila's plan, the uniform split and the memory-proportional split;
(c) the median error of the planner's predicted stage time against the measured one, over every
    stage of every split in (b).
Every session is real: rendezvous and members are processes, links are QUIC over UDP.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

HELP = "ring vs one llama.cpp context; Kafila vs uniform vs memory-proportional throughput; prediction error"
PROMPTS = ["Tell me about the history of paper.", "Explain how a bicycle works.", "Describe a busy market.",
           "Write about the sea at night."]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=64, help="tokens per reply (default 64)")
    p.add_argument("--throttles", default="1,2,4,8", help="EMULATION: slow-downs of the heterogeneous fleet")
    p.add_argument("--strategies", default="kafila,uniform,memory", help="splits to compare")


async def _replies(url: str, n_users: int, tokens: int) -> tuple[float, int, list[dict[str, Any]]]:
    """n_users chats at once; (wall seconds, completion tokens, final stats of each)."""
    from kafila.bench.replies import chat

    t0 = time.perf_counter()
    replies = await asyncio.gather(*(chat(url, PROMPTS[i % len(PROMPTS)], tokens) for i in range(n_users)))
    return time.perf_counter() - t0, sum(int(r.stats.get("completion_tokens") or 0) for r in replies), \
        [r.stats for r in replies]


def _session(members: tuple, strategy: str, fresh: bool, threads: int | None = None) -> Any:
    from kafila.session.launch.demo import DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread

    opts = DemoOptions(members=members, strategy=strategy, api_port=0, context=1024, fresh_probe=fresh,
                       threads=threads)
    return SessionThread(lambda state: run_demo(opts, state))


def _local_ms_per_token(tokens: int) -> float:
    """Median ms per decode step of one llama.cpp context on the whole file (same settings as a stage)."""
    from kafila.bench.local_context import decode_step_s
    from kafila.engine.stage import ContextConfig
    from kafila.model.embedded import default_model_path

    config = ContextConfig(n_ctx_per_seq=1024, n_seq_max=4, n_batch=128)
    return decode_step_s(default_model_path(), config, tokens) * 1e3


def _pipe_floor(plan: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The plan's stages in processes joined by pipes (kafila.bench.pipe_ring), head last."""
    from kafila.bench.pipe_ring import pipe_ring
    from kafila.model.cut import StageSpec
    from kafila.model.embedded import default_model_path
    from kafila.model.stage_cache import StageCache
    from kafila.session.launch.demo import SHARED_MACHINE_ENV

    order: list[str] = plan["order"]
    chain = order[1:] + order[:1]
    model, cache = default_model_path(), StageCache()
    ranges: dict[str, list[int]] = plan["ranges"]
    paths = [cache.stage(model, StageSpec(ranges[n][0], ranges[n][1], n == order[0])) for n in chain]
    return pipe_ring(model, paths, os.cpu_count() or 1, SHARED_MACHINE_ENV, tokens)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kafila.bench.report import emit, envelope
    from kafila.errors import SessionError
    from kafila.session.launch.demo import DemoMember

    console = Console(stderr=True)
    names = ["ada", "bo", "cy", "dee", "eve", "fay", "gus", "hal"]
    throttles = [float(t) for t in args.throttles.split(",")]
    hetero = tuple(DemoMember(n, t) for n, t in zip(names, throttles, strict=False))
    even = tuple(DemoMember(n) for n in names[:3])

    console.log("(a) 3-member ring without slow-down against one local context")
    local_ms = _local_ms_per_token(args.tokens)
    # one user: the stages compute one after another, so each may use every core
    with _session(even, "kafila", fresh=True, threads=os.cpu_count() or 1) as s:
        state = s.wait_settled(600)
        if state.phase != "admitted":
            raise SessionError(f"the bench ring was not admitted: {state.rejection}")
        asyncio.run(_replies(state.api_url or "", 1, 8))  # warm-up
        _, _, stats = asyncio.run(_replies(state.api_url or "", 1, args.tokens))
        plan = state.plan or {}
    console.log("(a) the same stages joined by OS pipes: what this machine allows without a network stack")
    floor = _pipe_floor(plan, args.tokens)
    # like with like: the median gap between tokens against the local context's median decode step
    # (the mean, which carries this shared machine's stalls, is reported beside it)
    ring_ms = float(stats[0]["token_interval_median_ms"])
    ring_mean_ms = 1e3 / stats[0]["tokens_per_s"]
    latency = {"local_ms_per_token": local_ms, "ring_ms_per_token": ring_ms, "ratio": ring_ms / local_ms,
               "ring_mean_ms_per_token": ring_mean_ms, "mean_ratio": ring_mean_ms / local_ms,
               "pipe_ring_ms_per_token": floor["ms_per_token"], "pipe_ratio": floor["ms_per_token"] / local_ms,
               "pipe_ring_stage_ms": floor["stage_ms"],
               "target": "ring <= 1.25x local (medians)", "target_met": ring_ms / local_ms <= 1.25}

    throughput: dict[str, Any] = {}
    errors: list[float] = []
    for i, strategy in enumerate(args.strategies.split(",")):
        console.log(f"(b) {strategy} split on the fleet with slow-downs {throttles}")
        with _session(hetero, strategy, fresh=i == 0) as s:
            state = s.wait_settled(600)
            if state.phase != "admitted":
                throughput[strategy] = {"admitted": False, "reason": state.rejection}
                continue
            asyncio.run(_replies(state.api_url or "", 1, 8))  # warm-up
            one_wall, one_n, one_stats = asyncio.run(_replies(state.api_url or "", 1, args.tokens))
            four_wall, four_n, _ = asyncio.run(_replies(state.api_url or "", 4, args.tokens))
            plan = state.plan or {}
        stages = one_stats[0].get("stages", {}) if one_stats else {}
        stage_err = {n: abs(v["measured_s"] - v["predicted_s"]) / v["predicted_s"] for n, v in stages.items()
                     if v.get("measured_s") and v.get("predicted_s")}
        errors += stage_err.values()  # every stage of every split: one cost model predicted them all
        throughput[strategy] = {
            "admitted": True, "order": plan.get("order"), "ranges": plan.get("ranges"),
            "bottleneck_predicted_s": plan.get("bottleneck_seconds"),
            "one_user_tokens_per_s": one_n / one_wall, "four_users_tokens_per_s": four_n / four_wall,
            "four_vs_one": (four_n / four_wall) / (one_n / one_wall),
            "stages": stages, "stage_error": stage_err,
            "median_stage_error": statistics.median(stage_err.values()) if stage_err else None,
        }
    base = throughput.get("kafila", {}).get("one_user_tokens_per_s")
    for t in throughput.values():
        if base and t.get("admitted"):
            t["four_users_vs_kafila_one_user"] = t["four_users_tokens_per_s"] / base
    median_err = statistics.median(errors) if errors else None
    results = {"latency": latency, "throughput": throughput, "fleet_throttles": throttles,
               "prediction": {"median_relative_error": median_err, "target": "<= 10%",
                              "target_met": median_err is not None and median_err <= 0.10}}
    emit(envelope("ring", results), args.json, args.out, args.plot)
    if not args.json:
        out = Console()
        out.print(f"(a) decode, median ms/token: ring {ring_ms:.2f}, local {local_ms:.2f}, "
                  f"ratio {ring_ms / local_ms:.2f} (target <= 1.25); ring mean {ring_mean_ms:.2f} "
                  f"({ring_mean_ms / local_ms:.2f}x); the same stages over OS pipes "
                  f"{floor['ms_per_token']:.2f} ({floor['ms_per_token'] / local_ms:.2f}x, this machine's floor)")
        table = Table("split", "1 user tok/s", "4 users tok/s", "4 users ÷ 1 user", "4 users ÷ Kafila 1 user",
                      title=f"(b) emulated fleet, slow-downs {throttles}")
        for k, t in throughput.items():
            if not t.get("admitted"):
                table.add_row(k, "not admitted", t.get("reason") or "", "", "")
                continue
            table.add_row(k, f"{t['one_user_tokens_per_s']:.1f}", f"{t['four_users_tokens_per_s']:.1f}",
                          f"{t['four_vs_one']:.2f}×", f"{t.get('four_users_vs_kafila_one_user', 0):.2f}×")
        out.print(table)
        if median_err is not None:
            per_split = ", ".join(f"{k} {t['median_stage_error']:.1%}" for k, t in throughput.items()
                                  if t.get("median_stage_error") is not None)
            out.print(f"(c) median |measured − predicted| / predicted stage time over {len(errors)} stages: "
                      f"{median_err:.1%} (target <= 10%; per split: {per_split})")
    return 0

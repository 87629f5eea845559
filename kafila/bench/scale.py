"""`kafila bench scale`: the 3-member loopback ring on a random-weight file with a real model's block shapes.

In one run, each figure beside its target from issue 11's acceptance:
- cut and delivery time and MB/s of every member's stage, beside aioquic's own one-way rate on
  one connection for the datagram size Kafila uses (kafila.bench.quic_rate, same run) and a stage
  delivered over one Kafila link in the same conditions (kafila.bench.delivery_rate): the ring's host
  feeds three members at once from one process, so each member's rate is about a third of it;
- peak RSS of every process, and each member's during delivery above its RSS before it;
- decode ms/token of the ring against one local llama.cpp context;
- TTFT of a long prompt through the ring against one local context, without and with the
  emulated slow-downs;
- predicted against measured stage times (and TTFT, when the plan predicts it).
The model file is made once (kafila.model.random_gguf) and cached; stages are cut and delivered
afresh in a scratch cache each run, so the delivery figures are real transfers. Several models
(`--shape a,b:9 --model smollm2`) run one after another on one probe, measured at the start, and the
stage-time error is pooled over all their stages as well as given per model.
The printed report is kafila.bench.scale_report's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafila.bench.proc_mem import RssSampler, reset_peak, status_kb
from kafila.errors import ModelError

if TYPE_CHECKING:
    from kafila.model.random_gguf import Shape

HELP = "a real model's block shapes through the loopback ring: delivery, memory, decode, TTFT, predictions"
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "  # 14 tokens in SmolLM2's vocabulary
ANSWER_ROOM = 64  # context beyond the prompt
MEMBERS = ("ada", "bo", "cy")  # the loopback ring
DECODE_TARGET = 0.7  # the ring's decode tokens/s against one local context (issue 37; issue 11 asked 0.6)
DECODE_ROUNDS = 3  # the ring's decode and one local context's, alternating


def configure(p: argparse.ArgumentParser) -> None:
    from kafila.model.random_gguf import SHAPES

    p.add_argument("--shape", default=None,
                   help="model shapes, comma-separated, each NAME or NAME:BLOCKS, run one after another on one "
                        f"probe (default llama3-8b unless --model; known: {', '.join(sorted(SHAPES))})")
    p.add_argument("--blocks", type=int, default=None,
                   help="blocks in the file of a shape without :BLOCKS (default: the shape's, e.g. 6)")
    p.add_argument("--model", default=None,
                   help="a real model, run after the shapes (alone without --shape): a GGUF file with a chat "
                        "template, or a name (smollm2: the embedded model the probe measures)")
    p.add_argument("--prompt-tokens", type=int, default=2000, help="about this many tokens of prompt (default 2000)")
    p.add_argument("--tokens", type=int, default=32, help="tokens of the decode reply (default 32)")
    p.add_argument("--reply-tokens", type=int, default=16,
                   help="greedy reply to the long prompt, compared with llama-cpp-python's (default 16)")
    p.add_argument("--throttles", default="1,2,4", help="EMULATION: slow-downs of the second ring (default 1,2,4)")
    p.add_argument("--quic-mb", type=int, default=64, help="MB of the bare aioquic transfer (default 64)")


def long_prompt(n_tokens: int) -> str:
    """Text of about n_tokens tokens (the exact count is what the tokenizer says; both sides use it)."""
    return SENTENCE * max(1, round(n_tokens / 14))


def _target(value: float | None, limit: float, at_most: bool, text: str) -> dict[str, Any]:
    met = None if value is None else (value <= limit if at_most else value >= limit)
    return {"value": value, "target": text, "met": met}


def _ring(model: Path, members: tuple[Any, ...], context: int, cache: Path, threads: int, prompt: str,
          tokens: tuple[int, int], progress: Any, label: str) -> dict[str, Any]:
    """One ring session: settle, TTFT of the prompt, then (unthrottled only) decode; memory and delivery."""
    from kafila.bench import scale_ring
    from kafila.errors import KafilaError
    from kafila.errors import first_kafila_error as _first_kafila_error

    clock = scale_ring.DeliveryClock()
    sampler = RssSampler(in_window=clock.delivering, active=clock.any_delivering)
    task = progress.add_task(f"{label}: starting", total=None)
    bars: dict[str, Any] = {}

    def show(state: Any) -> None:
        progress.update(task, description=f"{label}: {state.phase}")
        for name, (sent, total) in list(state.delivery.items()):
            if name not in bars:
                bars[name] = progress.add_task(f"{label}: stage to {name}", total=total, bytes=True)
            progress.update(bars[name], completed=sent, total=total)

    reset_peak()
    sampler.start()
    out: dict[str, Any] = {}
    try:
        out = _serve(model, members, context, cache, threads, prompt, tokens, progress, label, task,
                     [clock, show], sampler)
        out["ok"] = True
    except Exception as exc:  # e.g. a stage not delivered in the host's time: reported beside what was measured
        # (the session may raise it inside a group, as the CLI's boundary unwraps it)
        err = exc if isinstance(exc, KafilaError) else (
            _first_kafila_error(exc) if isinstance(exc, BaseExceptionGroup) else None)
        if err is None:
            raise
        out = {"ok": False, "error": str(err), "ttft": {"ok": False, "error": str(err)}, "peak_rss_mb": {}}
        exc = err
        progress.update(task, description=f"{label}: failed: {exc}")
    finally:
        sampler.stop()
    progress.update(task, total=1, completed=1)
    out["delivery"] = clock.report()
    out["delivery_all"] = clock.span()
    out["delivery_incomplete"] = clock.incomplete()
    out["delivery_rss_mb"] = {n: {"before": sampler.first_kb[n] / 1024, "peak": sampler.window_peak_kb[n] / 1024,
                                  "above": (sampler.window_peak_kb[n] - sampler.first_kb[n]) / 1024}
                              for n in sampler.window_peak_kb}
    return out


def _serve(model: Path, members: tuple[Any, ...], context: int, cache: Path, threads: int, prompt: str,
           tokens: tuple[int, int], progress: Any, label: str, task: Any, listeners: list[Any],
           sampler: RssSampler) -> dict[str, Any]:
    """Start the ring, wait for it, measure TTFT (and decode when no member is slowed) and peak memory."""
    from kafila.bench import scale_ring
    from kafila.bench.local_context import LocalDecoder
    from kafila.engine.stage import ContextConfig
    from kafila.errors import SessionError
    from kafila.session.settings import SessionSettings

    with scale_ring.session(model, members, context, cache, threads) as s:
        for listener in listeners:
            s.state.subscribe(listener)
        state = s.wait_settled(3600)
        if state.phase != "admitted":
            raise SessionError(f"the benchmark's ring was not admitted: {state.rejection}")
        url = state.api_url or ""
        progress.update(task, description=f"{label}: TTFT of the long prompt")
        decode_tokens, reply_tokens = tokens
        ttft = scale_ring.ttft(url, prompt, reply_tokens)
        out: dict[str, Any] = {"order": state.plan.get("order") if state.plan else None,
                               "ranges": state.plan.get("ranges") if state.plan else None,
                               "ttft": ttft,
                               "plan_ttft_s": scale_ring.predicted_ttft(state.plan or {}, ttft.get("prompt_tokens")),
                               "stage_prefill_s": scale_ring.stage_prefill(state.plan or {}, ttft.get("prompt_tokens"))}
        if all(m.throttle == 1 for m in members):
            progress.update(task, description=f"{label}: decode, alternating with one local context")
            config = ContextConfig(n_ctx_per_seq=context, n_seq_max=1, n_batch=SessionSettings.batch)
            with LocalDecoder(model, config) as local:
                out["decode"] = scale_ring.decode(url, decode_tokens, local, DECODE_ROUNDS)
        out["peak_rss_mb"] = {"host (this process)": (status_kb(os.getpid(), "VmHWM") or 0) / 1024,
                              **{k: v / 1024 for k, v in sampler.peaks_kb().items()}}
    progress.update(task, description=f"{label}: done")
    return out


@dataclass(frozen=True)
class Subject:
    """One model the run measures: a random-weight file with a real model's shapes, or a real GGUF."""

    name: str
    path: Path
    blocks: int
    random_weights: bool


def parse_shapes(text: str, blocks: int | None) -> list[tuple[Shape, int]]:
    """`NAME[:BLOCKS],...` as shapes and their block counts (`blocks`, else the shape's default, without one)."""
    from kafila.model.random_gguf import shape_named

    out = []
    for item in text.split(","):
        name, _, count = item.strip().partition(":")
        shape = shape_named(name)
        n = blocks or shape.default_blocks
        if count:
            try:
                n = int(count)
            except ValueError:
                raise ModelError(f"{item.strip()!r}: blocks must be a whole number, as in {name}:9") from None
        if n < len(MEMBERS):
            raise ModelError(f"{item.strip()!r}: the benchmark's ring has {len(MEMBERS)} members and each holds at "
                             f"least one block: give {name}:{len(MEMBERS)} or more")
        out.append((shape, n))
    return out


def subjects(args: argparse.Namespace, progress: Any) -> list[Subject]:
    """Every model of the run, named and described before anything is measured; random files made once."""
    from kafila.model.describe import describe_model
    from kafila.model.embedded import resolve_model
    from kafila.model.random_gguf import cached_random_gguf
    from kafila.model.stage_cache import default_cache_root

    if args.shape:
        shapes = parse_shapes(args.shape, args.blocks)
    else:
        shapes = [] if args.model else parse_shapes("llama3-8b", args.blocks)
    real = resolve_model(args.model) if args.model else None
    real_blocks = describe_model(real).n_blocks if real else 0
    out = []
    for shape, blocks in shapes:
        task = progress.add_task(f"model file: {shape.name}, {blocks} blocks (made once, then cached)", total=None)
        out.append(Subject(shape.name, cached_random_gguf(shape, blocks, default_cache_root() / "models"), blocks,
                           True))
        progress.update(task, total=1, completed=1)
    if real:
        out.append(Subject(real.name, real, real_blocks, False))
    return out


def measure(args: argparse.Namespace, progress: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The probe, measured once, and every figure of every model's report (no targets yet)."""
    models = subjects(args, progress)
    threads = os.cpu_count() or 1  # one request at a time: the stages compute one after another
    task = progress.add_task("this machine's probe, measured once for every model of this run", total=None)
    probe, files = _measure_probe(threads)
    progress.update(task, total=1, completed=1)
    return probe, [_measure_one(s, args, progress, files, threads, f"{s.name}: " if len(models) > 1 else "")
                   for s in models]


def _measure_one(subject: Subject, args: argparse.Namespace, progress: Any, probe_files: dict[str, bytes],
                 threads: int, label: str) -> dict[str, Any]:
    """One model's figures: both rings, the pipe floor, aioquic alone, one Kafila link, one local context."""
    from kafila.bench.delivery_rate import delivery_rate
    from kafila.bench.local_context import local_context
    from kafila.bench.quic_rate import kafila_datagram_size, one_way_rate
    from kafila.model.stage_cache import default_cache_root
    from kafila.session.launch.demo import DemoMember
    from kafila.session.settings import SessionSettings

    model = subject.path
    prompt = long_prompt(args.prompt_tokens)
    context = args.prompt_tokens + args.prompt_tokens // 4 + ANSWER_ROOM
    throttles = [float(t) for t in args.throttles.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=default_cache_root()))
    for name, data in probe_files.items():  # the run's one probe, for the members to find in their cache
        (scratch / name).write_bytes(data)
    tokens = (args.tokens, args.reply_tokens)
    floor: dict[str, Any] | None = None
    try:
        plain = _ring(model, tuple(DemoMember(n) for n in MEMBERS), context, scratch, threads, prompt, tokens,
                      progress, f"{label}ring, no slow-down")
        slow: dict[str, Any] = {"ok": False, "ttft": {"ok": False, "error": "not run: the ring without slow-downs "
                                                                       "failed"}, "delivery": {}}
        if plain["ok"]:
            slow = _ring(model, tuple(DemoMember(n, t) for n, t in zip(MEMBERS, throttles, strict=False)), context,
                         scratch, threads, prompt, tokens, progress, f"{label}ring, slow-downs {args.throttles}")
        if plain.get("order") and plain.get("ranges"):
            task = progress.add_task(f"{label}the ring's stages joined by OS pipes (the floor)", total=None)
            floor = _pipe_floor(model, scratch, plain["order"], plain["ranges"], args.tokens, threads)
            progress.update(task, total=1, completed=1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    task = progress.add_task(f"{label}aioquic alone, one connection", total=None)
    datagram = kafila_datagram_size()
    quic = one_way_rate(args.quic_mb << 20, datagram)
    progress.update(task, total=1, completed=1)
    task = progress.add_task(f"{label}a stage over one Kafila link", total=None)
    one_link = delivery_rate(args.quic_mb << 20)
    progress.update(task, total=1, completed=1)
    task = progress.add_task(f"{label}one local llama.cpp context", total=None)
    local = local_context(model, prompt, context, SessionSettings.batch, args.reply_tokens)
    progress.update(task, total=1, completed=1)
    return {"shape": subject.name, "random_weights": subject.random_weights, "blocks": subject.blocks,
            "model_bytes": model.stat().st_size, "model": model.name,
            "context": context, "n_batch": SessionSettings.batch, "threads": threads, "throttles": throttles,
            "ring": plain, "ring_slowed": slow, "aioquic": quic, "delivery_one_link": one_link, "local": local,
            "pipe_floor": floor, "replies": _replies(local, plain, slow)}


def _measure_probe(threads: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The members' probe, measured afresh (a probe kept for a day may have been taken under another load, and
    the predictions are held against this run's times) in the user cache, whose large-block probe file is
    made once: its result and the cache's probe files, for every model's scratch cache."""
    from kafila.engine.probe_cache import PROBE_FILE_PREFIX, cached_probe
    from kafila.model.embedded import default_model_path
    from kafila.model.stage_cache import StageCache, default_cache_root

    user = StageCache(default_cache_root())
    result = cached_probe(default_model_path(), user, threads=threads, fresh=True)
    return result.as_dict(), {p.name: p.read_bytes() for p in user.root.glob(f"{PROBE_FILE_PREFIX}*.json")}


def _pipe_floor(model: Path, cache: Path, order: list[str], ranges: dict[str, list[int]], tokens: int,
                threads: int) -> dict[str, Any]:
    """The ring's stages (as the host cut them) in processes joined by OS pipes: decode without a network stack."""
    from kafila.bench.pipe_ring import pipe_ring
    from kafila.model.cut import StageSpec
    from kafila.model.stage_cache import StageCache
    from kafila.session.launch.demo import SHARED_MACHINE_ENV

    chain = order[1:] + order[:1]  # the head's stage last
    stages = StageCache(cache)
    paths = [stages.stage(model, StageSpec(ranges[n][0], ranges[n][1], n == order[0])) for n in chain]
    out: dict[str, Any] = pipe_ring(model, paths, threads, SHARED_MACHINE_ENV, tokens)
    out["member_ms"] = dict(zip(chain, out["stage_ms"], strict=True))
    return out


def _replies(local: dict[str, Any], *rings: dict[str, Any]) -> dict[str, Any]:
    """Each ring's greedy reply to the long prompt against llama-cpp-python's (the acceptance's first bullet)."""
    out: dict[str, Any] = {"llama_cpp": local.get("reply")}
    for label, ring in zip(("ring", "ring_slowed"), rings, strict=True):
        reply = ring["ttft"].get("reply")
        out[label] = {"reply": reply, "identical": None if reply is None else reply == local.get("reply")}
    return out


def judge(r: dict[str, Any]) -> dict[str, Any]:
    """Each figure beside its target (issue 11's acceptance), met or missed (None: not measured)."""
    from kafila.bench.scale_ring import head_ttft

    ring, slow, local, quic = r["ring"], r["ring_slowed"], r["local"], r["aioquic"]
    t: dict[str, Any] = {}
    ttft = ring["ttft"].get("ttft_s")
    t["ttft_vs_local"] = _target(ttft / local["ttft_s"] if ttft else None, 1.3, True, "ring TTFT <= 1.3x local")
    # an unpipelined ring takes the sum of the stages' prefill times: the local prefill, measured, scaled by
    # the plan's ratio of the stages' slowed prefill to their compute (the head's last layer is cheap in
    # prefill, so its slow-down weighs less than its share of the blocks)
    shares = slow.get("stage_prefill_s") or {}
    compute = sum(c for _, c in shares.values())
    unpiped = local["ttft_s"] * sum(t for t, _ in shares.values()) / compute if compute else None
    slow_ttft = slow["ttft"].get("ttft_s")
    t["ttft_slowed_vs_unpipelined"] = _target(slow_ttft / unpiped if slow_ttft and unpiped else None, 0.7, True,
                                              "slowed ring TTFT <= 0.7x sum of stage prefill times (estimate)")
    errors = [e["error"] for e in r["stage_times"].values()]
    t["stage_time_error"] = _target(statistics.median(errors) if errors else None, 0.10, True,
                                    "median |pred - meas| / meas <= 10%")
    for key, which in (("ttft_prediction_error", ring), ("ttft_slowed_prediction_error", slow)):
        pred, measured = which.get("plan_ttft_s"), head_ttft(which["ttft"])
        t[key] = _target(abs(pred - measured) / measured if pred and measured else None, 0.25, True,
                         f"|pred - meas| / meas <= 25% (TTFT at the head{', slowed ring' if which is slow else ''})")
    # like for like: one stage over one link against aioquic over one connection, same size, same datagrams
    t["delivery_vs_aioquic"] = _target(r["delivery_one_link"]["mb_per_s"] / quic["mb_per_s"], 0.9, False,
                                       "delivery over one link >= 0.9x aioquic one connection")
    # the ring's host sends to all members from one process: together they compare with one connection
    span = ring.get("delivery_all")
    t["ring_delivery_vs_aioquic"] = _target(span["mb_per_s"] / quic["mb_per_s"] if span else None, 0.9, False,
                                            "ring's delivery, all members together >= 0.9x aioquic")
    above = [d["above"] for d in ring["delivery_rss_mb"].values()]
    t["delivery_rss_above_idle_mb"] = _target(max(above) if above else None, 200, True,
                                              "peak RSS during delivery <= 200 MB above before")
    # both rings' replies count: one that failed to reply is not identical
    same = [r["replies"][k]["identical"] for k in ("ring", "ring_slowed")]
    share = None if all(v is None for v in same) else sum(v is True for v in same) / len(same)
    t["reply_identical"] = {"value": share, "met": None if share is None else share == 1.0,
                            "target": "greedy replies through both rings == llama-cpp-python's (share of the two)"}
    t["decode_vs_local"] = _target((ring.get("decode") or {}).get("vs_local"), DECODE_TARGET, False,
                                   f"ring tok/s >= {DECODE_TARGET}x local (median of {DECODE_ROUNDS} rounds, "
                                   "each the ring's then the local context's)")
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from kafila.bench import scale_ring
    from kafila.bench.report import emit, envelope
    from kafila.bench.scale_report import print_run

    console = Console(stderr=True)
    class Bytes(DownloadColumn):
        """Sizes for the stage transfers only (the other steps have no unit)."""

        def render(self, task: Any) -> Any:
            return super().render(task) if task.fields.get("bytes") else ""

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), Bytes(),
                  TimeElapsedColumn(), console=console) as progress:
        probe, runs = measure(args, progress)
    for r in runs:
        r["stage_times"] = scale_ring.stage_errors((r["ring"].get("decode") or {}).get("stages") or {},
                                                   (r.get("pipe_floor") or {}).get("member_ms") or {})
        r["targets"] = judge(r)
    pooled = pool(runs)
    emit(envelope("scale", {"probe": probe, "runs": runs, "targets": pooled}), args.json, args.out, args.plot)
    if not args.json:
        print_run(probe, runs, pooled)
    return 0


def pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets over every model of the run: stage times pooled over all their stages, on the one probe."""
    errors = [e["error"] for r in runs for e in r["stage_times"].values()]
    return {"stage_time_error": _target(statistics.median(errors) if errors else None, 0.10, True,
                                        "median |pred - meas| / meas <= 10%, every stage of every model, one probe")}

"""Self-measurement for the planner: effective bytes/s of a stage, fixed costs per call and block, usable memory.

The cost model says a decode call of a stage of `n` blocks holding `w` weight bytes takes
`o + n·p + w / b` (DESIGN §2c: every block costs a fixed ~0.1 ms of thread barriers besides its bytes).
The probe times decode calls of cuts with small blocks (the model given, usually the embedded 135M
model's 2.2 MB blocks) and with large ones (a random-weight file with Llama-3.1-8B's 123 MB blocks,
written once into the cache), and fits `o`, `p` and `b` by least squares: on small blocks alone the
per-block cost looks like bandwidth, and the fit would predict large blocks twice too slow.
Head cuts (the last block with the output layer) of both files are timed among them: what each takes
beyond its block is the unembedding, whose own quantisation and shape run at another speed than the
blocks. From the small model's output matrix (SmolLM2: 30 MB, 576 wide) and the large file's (a real
128,256-token vocabulary, 295 MB) the probe fits unembedding seconds = fixed + bytes / speed: measured
on the small one alone, the 8B shape's head was predicted a third too slow in the ring.

Prefill: the same cuts are timed on calls of PREFILL_ROWS rows (the host's default --batch), and
the same three-term shape is fitted to them (with one mixture-of-experts block per expert weight type in
the same rounds: what those take beyond their dense part is the routed experts' rate, EXPERT_SHAPES);
the planner predicts a chunk of another size on the line between a decode call (1 row) and this one
(kafila.planner.ttft). A row of prefill is compute, not
weight reads, so its "bandwidth" is weight bytes processed per second at that many rows. Those chunks
start a sequence; a later chunk's rows also attend to every position before it (llama.cpp computes
each row against the whole cache): one block of the small model is timed at ATTENTION_AT against
position 0, and the difference per row, earlier position and unit of attention width (heads × (key +
value length)) is `prefill_attn_s`. Its narrow blocks show it (on SmolLM2 it doubled a 2,000-token
prompt's prefill); an 8B model's wide blocks hide it in the weights' compute.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kafila.engine.call_timing import time_attention, time_decode_calls, time_prefill_calls
from kafila.engine.devices import DEVICE_MARGIN, Offload
from kafila.engine.memory import available_memory, resident_memory
from kafila.engine.stage import ContextConfig, StageEngine
from kafila.errors import EngineError
from kafila.model.cut import StageSpec, write_stage
from kafila.model.describe import ModelInfo, describe_model
from kafila.model.random_gguf import SHAPES, Shape, cached_random_gguf
from kafila.model.stage_cache import StageCache

log = logging.getLogger("kafila.probe")
T = TypeVar("T")
DEFAULT_SIZES = (1, 4, 10, 20)  # blocks per cut
LARGE_SHAPE = SHAPES["llama3-8b"]  # the large-block file's shape (kafila.model.random_gguf)
LARGE_SIZES = (1, 2)  # blocks per cut of the large-block file
MODELS_FOLDER = "probe-models"  # in the cache root: the large-block file, written once
SAFETY_MARGIN = 0.10  # of available memory, left for the OS and other programs
SCRATCH_PREFIX = "probe-stages-"  # the probe's cuts, in a folder of the cache root removed after it
DECODE_ATTEMPTS = 3  # decode timings that fit nothing (a busy machine) are measured again, this many in all
FIT_RESIDUAL = 0.10  # ... and those a fit misses by more than this (relative RMS): quiet runs here fit within 5 %
PREFILL_ROWS = 128  # rows of the probe's prefill calls: the host's default --batch
PREFILL_CALLS = 2  # timed prefill calls per cut, the fastest counts (0.1–1 s each here; one was not steady enough)
PREFILL_SMALL = (1, 4)  # the small-block cuts whose prefill is timed (with every large-block cut): a
# 128-row call of the embedded model's 20-block cut took 3.5 s here, most of the probe's time for little
ATTENTION_AT = 1024  # a prefill chunk timed at this position against position 0: its rows' attention to it
ATTENTION_CALLS = 3  # the fastest of this many at each position (a call of one small block: ~20–60 ms)
# One block per expert weight type with every expert used by every row: its prefill beyond the dense part's
# prediction is the routed experts' compute. A prefill row computes only its k experts, and on one Qwen3-30B-
# A3B block k patched to 1…128 of 128 took 72 ms + 17.6 ms per k for 128 rows, within 3 % of a line whether
# each expert saw 8 rows or all 128: the rate per expert byte does not depend on how the rows spread, but
# it is 1.5× (Q4_0) and 1.7× (MXFP4, gpt-oss-20b's 32 experts: 95–111 ms per k) slower than a dense
# matrix's (mul_mat_id, and MXFP4's own kernels). Qwen3-30B-A3B's widths with 8 of 8 experts (33 MB) and
# gpt-oss-20b's with 4 of 4 (82 MB).
EXPERT_SHAPES = (replace(SHAPES["qwen3-30b-a3b"], name="qwen3-30b-a3b-8of8", experts=8, experts_used=8),
                 replace(SHAPES["gpt-oss-20b"], name="gpt-oss-20b-4of4", experts=4, experts_used=4))


@dataclass(frozen=True)
class ProbeResult:
    """What this machine offers the ring; the planner's member inputs."""

    bandwidth_bytes_per_s: float
    dispatch_s: float
    memory_bytes: int  # what weights and KV cache may use: available − runtime overhead − margin
    available_bytes: int
    runtime_overhead_bytes: int
    samples: tuple[tuple[int, float], ...]  # (weight bytes, median seconds per decode call)
    fit_residual: float  # relative RMS error of the linear fit
    head_call_s: float  # median seconds per decode call of the (small model's) head cut
    unembed_bandwidth_bytes_per_s: float  # unembedding: bytes / (its share of a head cut's call − unembed_s)
    device: str | None = None  # the GPU the stages ran on (None: the CPU); then memory_bytes is its memory
    device_free_bytes: int | None = None
    block_s: float = 0.0  # fixed seconds per block per call (p), besides its bytes
    sample_blocks: tuple[int, ...] = ()  # blocks of each sample's cut, in the order of `samples`
    # prefill: one call of `prefill_rows` rows costs prefill_dispatch_s + n·prefill_block_s + bytes/prefill_bandwidth
    prefill_rows: int = 0  # 0: not measured (a probe of an older version)
    prefill_bandwidth_bytes_per_s: float = 0.0
    prefill_dispatch_s: float = 0.0
    prefill_block_s: float = 0.0
    prefill_samples: tuple[tuple[int, float], ...] = ()  # (weight bytes, fastest seconds per prefill call)
    prefill_fit_residual: float = 0.0
    prefill_sample_blocks: tuple[int, ...] = ()  # blocks of each prefill sample's cut
    unembed_s: float = 0.0  # fixed seconds of an unembedding besides its bytes (norm, logits, a graph's nodes)
    unembed_samples: tuple[tuple[int, float], ...] = ()  # (output matrix bytes, its seconds in a head call)
    prefill_attn_s: float = 0.0  # seconds per prefill row, earlier position and unit of attention width
    attention_samples: tuple[float, ...] = ()  # fastest seconds of one block's chunk at position 0 and ATTENTION_AT
    # routed experts in prefill, per expert weight type: (type, expert bytes × used per row per second; 0: no
    # slower than dense, the dense rate applies), and the MoE blocks' (type, expert bytes × used, dense bytes,
    # fastest seconds) they come from (EXPERT_SHAPES)
    expert_rates: tuple[tuple[str, float], ...] = ()
    expert_samples: tuple[tuple[str, float, float, float], ...] = ()

    def predict(self, n_blocks: int, nbytes: int) -> float:
        """Seconds of one decode call of a stage of `n_blocks` blocks holding `nbytes`: o + n·p + bytes/b."""
        return self.dispatch_s + n_blocks * self.block_s + nbytes / self.bandwidth_bytes_per_s

    def predict_prefill(self, n_blocks: int, nbytes: int) -> float:
        """Seconds of one prefill call of `prefill_rows` rows through such a stage (same shape, own fit)."""
        return self.prefill_dispatch_s + n_blocks * self.prefill_block_s + nbytes / self.prefill_bandwidth_bytes_per_s

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["samples"] = [list(s) for s in self.samples]
        d["sample_blocks"] = list(self.sample_blocks)
        d["prefill_samples"] = [list(s) for s in self.prefill_samples]
        d["prefill_sample_blocks"] = list(self.prefill_sample_blocks)
        d["unembed_samples"] = [list(s) for s in self.unembed_samples]
        d["attention_samples"] = list(self.attention_samples)
        d["expert_rates"] = [list(s) for s in self.expert_rates]
        d["expert_samples"] = [list(s) for s in self.expert_samples]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProbeResult:
        """The result back from `as_dict` (a cached probe)."""
        lists = {k: tuple(tuple(s) for s in d.get(k, ())) for k in ("samples", "prefill_samples", "unembed_samples",
                                                                   "expert_rates", "expert_samples")}
        counts = {k: tuple(d.get(k, ())) for k in ("sample_blocks", "prefill_sample_blocks", "attention_samples")}
        return cls(**{**d, **lists, **counts})


def memory_read_bandwidth(n_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-`repeats` bytes/s of reading a large array on all cores: the machine's raw read speed."""
    from concurrent.futures import ThreadPoolExecutor

    data = np.ones(n_bytes // 4, np.float32)
    workers = os.cpu_count() or 1
    parts = np.array_split(data, workers)
    best = float("inf")
    with ThreadPoolExecutor(workers) as pool:  # numpy's reductions release the GIL
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - t0)
    return data.nbytes / best


def fit_cost(samples: list[tuple[int, float]], blocks: list[int] | None = None) -> tuple[float, float, float, float]:
    """Least-squares fit of seconds = o + n·p + bytes / b with o, p >= 0; returns (b, o, p, relative RMS residual).

    Without block counts (or cuts that cannot tell the three terms apart) p is 0: the two-term fit. The
    non-negative optimum is found by trying every set of o and p held at zero (a few small fits) and
    keeping the best valid one, which is exact for so few unknowns (the optimum of a convex problem
    under sign constraints is the unconstrained optimum of one of those faces). The bandwidth term is
    always fitted (a finite b), except in the flat fit: when that fits best, nothing grew with size.
    """
    x = np.array([s[0] for s in samples], float)
    y = np.array([s[1] for s in samples], float)
    n = np.array(blocks if blocks is not None else [0] * len(samples), float)
    # p is identifiable only when bytes, blocks and the constant are independent over the cuts
    scaled = np.stack([x / max(x.max(), 1.0), np.ones_like(x), n / max(n.max(), 1.0)], axis=1)
    use_p = blocks is not None and np.linalg.matrix_rank(scaled) == 3
    best: tuple[float, float, float, float] | None = None
    # every combination of the fixed terms held at zero, plus the flat fit (no growth with size at all)
    faces = [(True, free_o, free_p) for free_o in (True, False) for free_p in ((True, False) if use_p else (False,))]
    for free_b, free_o, free_p in [*faces, (False, True, False)]:
        cols = ([x] if free_b else []) + ([np.ones_like(x)] if free_o else []) + ([n] if free_p else [])
        coef = list(np.linalg.lstsq(np.stack(cols, axis=1), y, rcond=None)[0])
        slope = float(coef.pop(0)) if free_b else 0.0
        o = float(coef.pop(0)) if free_o else 0.0
        p = float(coef.pop(0)) if free_p else 0.0
        if slope < 0 or o < 0 or p < 0:
            continue
        err = float(np.sum((y - (o + n * p + slope * x)) ** 2))
        if best is None or err < best[3] * (1 - 1e-12):
            best = (slope, o, p, err)
    if best is None or best[0] <= 0:
        raise EngineError("the timings did not grow with stage size; the machine is too noisy to probe now")
    slope, o, p, _ = best
    resid = float(np.sqrt(np.mean((y - (o + n * p + slope * x)) ** 2)) / np.mean(y))
    return float(1.0 / slope), o, p, resid


def retry_noisy(measure: Callable[[], T], attempts: int = DECODE_ATTEMPTS,
                residual: Callable[[T], float] | None = None) -> T:
    """`measure()`, called again while it raises EngineError or (given `residual`) its fit is off by more than
    FIT_RESIDUAL, at most `attempts` times in all; the best fit measured.

    A busy machine's timings can fit nothing (another job ran during the small cuts), or fit badly: one
    cut's calls all slowed by a neighbour bent the line (a 26 % residual put a 1-block Qwen3-30B-A3B stage
    44 % above what it took). A moment later they usually fit. The last attempt's error, with the count,
    is what the user sees when none fitted at all.
    """
    best: T | None = None
    for attempt in range(1, attempts + 1):
        try:
            got = measure()
        except EngineError as exc:
            if attempt == attempts and best is None:
                raise EngineError(f"{exc} (measured {attempts} times)") from exc
            log.warning("%s (attempt %d of %d); measuring again", exc, attempt, attempts)
            continue
        if residual is None:
            return got
        if best is None or residual(got) < residual(best):
            best = got
        if residual(best) <= FIT_RESIDUAL or attempt == attempts:
            break
        log.warning("the timings fit the cost model within %.0f %% only (attempt %d of %d); measuring again",
                    residual(got) * 100, attempt, attempts)
    assert best is not None
    return best


def probe(
    model: Path,
    cache: StageCache,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    calls: int = 20,
    warmup: int = 2,
    on_step: Callable[[str, int, int], None] | None = None,
    threads: int = 0,
    large: tuple[int, ...] = LARGE_SIZES,
    large_shape: Shape = LARGE_SHAPE,
    prefill_rows: int = PREFILL_ROWS,
    prefill_calls: int = PREFILL_CALLS,
    expert_shapes: tuple[Shape, ...] = EXPERT_SHAPES,
) -> ProbeResult:
    """Measure this machine with cuts of `model` of the given block counts and, unless `large` is empty,
    cuts of those block counts of a random-weight file with large (Llama-3.1-8B-shaped) blocks and one
    block of each of `expert_shapes` (all its experts used: the routed experts' prefill rate of its expert
    type), on `threads` threads (0: all)."""
    info = describe_model(model)
    sizes = tuple(sorted({min(s, info.n_blocks) for s in sizes}))
    if len(sizes) < 2:
        raise EngineError("probing needs at least two different cut sizes")
    # the session's batch size (a decode call reads the same weights whatever the context's n_batch)
    config = ContextConfig(n_ctx_per_seq=max(256, prefill_rows), n_seq_max=1, n_batch=max(8, prefill_rows),
                           n_threads=threads)
    total = warmup + calls
    engines: list[StageEngine] = []
    cuts = [(n, sum(info.blocks_bytes[:n])) for n in sizes]
    if large:
        if on_step:
            on_step("writing a large-block model (once)", 0, total)
        # a real-sized vocabulary: its head cut times an unembedding of the size real models have
        big = cached_random_gguf(large_shape, max(large), cache.root / MODELS_FOLDER)
        big_info = describe_model(big)
        cuts += [(n, sum(big_info.blocks_bytes[:n])) for n in sorted(set(large))]
    # Cut into a scratch folder removed afterwards, not the stage cache: a probe runs once a day, and its
    # cuts of the large file (1.1 GB with the real-vocabulary head) would stay on disk for nothing.
    cache.root.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=cache.root)

    def cut(path: Path, spec: StageSpec) -> Path:
        return write_stage(path, spec, Path(scratch.name) / f"{path.stem}-{spec.tag}.gguf")

    try:
        for n in sizes:
            if on_step:
                on_step(f"loading a {n}-block stage", 0, total)
            engines.append(StageEngine(cut(model, StageSpec(0, n, head=False)), config, final=False))
        for n in sorted(set(large)):
            if on_step:
                on_step(f"loading a {n}-block stage of large blocks", 0, total)
            engines.append(StageEngine(cut(big, StageSpec(0, n, head=False)), config, final=False))
        if on_step:
            on_step("loading a head stage", 0, total)
        heads = [(model, info)] + ([(big, big_info)] if large else [])
        for path, about in heads:
            n = about.n_blocks
            engines.append(StageEngine(cut(path, StageSpec(n - 1, n, head=True)), config, final=True))
        # what this process holds beyond the weights: interpreter, libraries, compute buffers
        weights = sum(b for _, b in cuts) + sum(a.blocks_bytes[-1] + a.head_bytes for _, a in heads)
        overhead = max(resident_memory() - weights, 0)
        counts = [n for n, _ in cuts]

        attempts = iter(range(1, DECODE_ATTEMPTS + 1))

        def decode_fit() -> tuple[list[float], tuple[float, float, float, float]]:
            step = f"timing decode calls (attempt {next(attempts)} of {DECODE_ATTEMPTS})"  # a member reports it
            timed_s = time_decode_calls(
                engines, calls, warmup, lambda done: on_step(step, done, total) if on_step else None
            )
            return timed_s, fit_cost([(b, t) for (_, b), t in zip(cuts, timed_s[:len(cuts)], strict=True)], counts)

        seconds, (bandwidth, dispatch, block_s, resid) = retry_noisy(decode_fit, residual=lambda got: got[1][3])
        seconds, head_seconds = seconds[:len(cuts)], seconds[len(cuts):]
        # the large-block cuts and the small ones of PREFILL_SMALL blocks (the large ones come after the small)
        timed = [i for i, (n, _) in enumerate(cuts) if i >= len(sizes) or n in PREFILL_SMALL]
        if len({cuts[i][0] for i in timed if i < len(sizes)}) < 2:  # a model of few blocks: its two smallest
            timed = sorted({*range(min(2, len(sizes))), *timed})
        moe_infos: list[ModelInfo] = []
        for shape in expert_shapes if large and prefill_rows else ():
            if on_step:
                on_step("loading mixture-of-experts blocks", len(moe_infos), len(expert_shapes))
            moe = cached_random_gguf(shape, 1, cache.root / MODELS_FOLDER, tokenizer=False)
            moe_infos.append(describe_model(moe))
            engines.append(StageEngine(cut(moe, StageSpec(0, 1, head=False)), config, final=False))
        # the MoE blocks in the same rounds as the dense cuts: their rate is a difference against the dense fit,
        # which a machine that changed speed in between would bend (this one swings by a third within minutes)
        prefill_s = time_prefill_calls(
            [engines[i] for i in timed] + engines[len(engines) - len(moe_infos):], prefill_rows, prefill_calls,
            lambda done: on_step("timing prefill calls", done, prefill_calls) if on_step else None)
        prefill_s, expert_s = prefill_s[:len(timed)], prefill_s[len(timed):]
        if on_step:
            on_step("timing attention over a long context", 0, 1)
        wide = replace(config, n_ctx_per_seq=ATTENTION_AT + prefill_rows)
        engines.append(StageEngine(cut(model, StageSpec(0, 1, head=False)), wide, final=False))
        at_start, at_later = time_attention(engines[-1], prefill_rows, ATTENTION_AT, ATTENTION_CALLS)
    finally:
        for engine in engines:
            engine.close()
        scratch.cleanup()
    offload = engines[0].offload  # the first stage saw the device's memory before any stage was on it
    samples = [(nbytes, t) for (_, nbytes), t in zip(cuts, seconds, strict=True)]
    unembed = [(a.unembed_bytes, t - (dispatch + block_s + a.blocks_bytes[-1] / bandwidth))
               for (_, a), t in zip(heads, head_seconds, strict=True)]
    unembed_bw, unembed_fixed = fit_unembedding(unembed, bandwidth)
    avail = available_memory()
    usable = max(int(avail * (1 - SAFETY_MARGIN)) - overhead, 0)
    device, device_free = offload_memory(offload)
    if device_free is not None:  # weights and KV cache live on the GPU: its memory is what the planner may fill
        usable = int(device_free * (1 - DEVICE_MARGIN))
    prefill = [(cuts[i][1], t) for i, t in zip(timed, prefill_s, strict=True)]
    try:
        p_bw, p_dispatch, p_block, p_resid = fit_cost(prefill, [cuts[i][0] for i in timed])
    except EngineError as exc:  # the member can still serve; the plan then predicts no TTFT
        log.warning("prefill not measured: %s", exc)
        prefill_rows, (p_bw, p_dispatch, p_block, p_resid) = 0, (0.0, 0.0, 0.0, 0.0)
    # noise can make the later call the faster: then attention counts as free, as before it was measured
    attn = max(at_later - at_start, 0.0) / (prefill_rows * ATTENTION_AT * info.attention_width) \
        if prefill_rows and info.attention_width else 0.0
    # what each row multiplies in the experts, and the rest of the block
    experts = tuple((m.expert_type, m.expert_bytes[0] * m.experts_used,
                     m.blocks_bytes[0] - m.expert_bytes[0] * m.experts, s)
                    for m, s in zip(moe_infos, expert_s, strict=True)) if prefill_rows else ()
    return ProbeResult(bandwidth, dispatch, usable, avail, overhead, tuple(samples), resid, head_seconds[0],
                       unembed_bw, device, device_free, block_s, tuple(counts), prefill_rows, p_bw, p_dispatch,
                       p_block, tuple(prefill), p_resid, tuple(cuts[i][0] for i in timed), unembed_fixed,
                       tuple(unembed), attn, (at_start, at_later),
                       tuple((e[0], expert_bandwidth(e[1:], p_bw, p_dispatch, p_block)) for e in experts), experts)


def expert_bandwidth(sample: tuple[float, ...], p_bw: float, p_dispatch: float, p_block: float) -> float:
    """Routed-expert bytes × experts used, per second of prefill, from one MoE block's (routed, dense, seconds):
    what the block took beyond its dense part's prefill prediction. 0 (the dense rate applies) when the
    call was no slower than its dense part alone: noise, nothing to learn from."""
    routed, dense, seconds = sample
    beyond = seconds - (p_dispatch + p_block + dense / p_bw)
    return routed / beyond if beyond > 0 else 0.0


def fit_unembedding(samples: list[tuple[int, float]], bandwidth: float) -> tuple[float, float]:
    """(bytes/s, fixed seconds) of the unembedding from (output bytes, seconds) of head cuts.

    A head cut no slower than its body (noise, or a tiny output layer) tells nothing: it is left out,
    and with nothing left the unembedding counts at the blocks' speed. One sample gives bytes / seconds.
    """
    usable = [(b, s) for b, s in samples if s > 0 and b > 0]
    if len(usable) >= 2 and len({b for b, _ in usable}) >= 2:
        try:
            speed, fixed, _, _ = fit_cost(usable)
            return speed, fixed
        except EngineError:  # did not grow with size: fall back to the larger output's own speed
            pass
    if usable:
        b, s = max(usable)
        return b / s, 0.0
    return bandwidth, 0.0


def offload_memory(offload: Offload | None) -> tuple[str | None, int | None]:
    """The GPU a probe's stages went on and its free memory before they loaded; (None, None) on the CPU."""
    if offload is None or offload.device is None or offload.device_free_bytes is None:
        return None, None
    return offload.device, offload.device_free_bytes

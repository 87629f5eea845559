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

Prefill: the same cuts are timed on one call of PREFILL_ROWS rows (the host's default --batch), and
the same three-term shape is fitted to it; the planner predicts a chunk of another size on the line
between a decode call (1 row) and this one (kafila.planner.ttft). A row of prefill is compute, not
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
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kafila.engine.devices import DEVICE_MARGIN, Offload
from kafila.engine.memory import available_memory, resident_memory
from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.errors import EngineError
from kafila.model.cut import StageSpec, write_stage
from kafila.model.describe import describe_model
from kafila.model.random_gguf import SHAPES, Shape, cached_random_gguf
from kafila.model.stage_cache import StageCache

log = logging.getLogger("kafila.probe")
T = TypeVar("T")
DEFAULT_SIZES = (1, 4, 10, 20)  # blocks per cut
LARGE_SHAPE = SHAPES["llama3-8b"]  # the large-block file's shape (kafila.model.random_gguf)
LARGE_SIZES = (1, 2)  # blocks per cut of the large-block file
MODELS_FOLDER = "probe-models"  # in the cache root: the large-block file, written once
SAFETY_MARGIN = 0.10  # of available memory, left for the OS and other programs
EVICT_BYTES = 128 << 20  # more than any CPU's last-level cache
IDLE_S = 0.02  # a ring member idles while the other stages compute; calls after idling run slower
SCRATCH_PREFIX = "probe-stages-"  # the probe's cuts, in a folder of the cache root removed after it
DECODE_ATTEMPTS = 3  # decode timings that fit nothing (a busy machine) are measured again, this many in all
PREFILL_ROWS = 128  # rows of the probe's prefill calls: the host's default --batch
PREFILL_CALLS = 1  # timed prefill calls per cut: each is long (0.1–5 s here), so one is steady enough
PREFILL_SMALL = (1, 4)  # the small-block cuts whose prefill is timed (with every large-block cut): a
# 128-row call of the embedded model's 20-block cut took 3.5 s here, most of the probe's time for little
ATTENTION_AT = 1024  # a prefill chunk timed at this position against position 0: its rows' attention to it
ATTENTION_CALLS = 3  # the fastest of this many at each position (a call of one small block: ~20–60 ms)


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
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProbeResult:
        """The result back from `as_dict` (a cached probe)."""
        lists = {k: tuple(tuple(s) for s in d.get(k, ())) for k in ("samples", "prefill_samples", "unembed_samples")}
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


def retry_noisy(measure: Callable[[], T], attempts: int = DECODE_ATTEMPTS) -> T:
    """`measure()`, called again while it raises EngineError, at most `attempts` times in all.

    A busy machine's timings can fit nothing (another job ran during the small cuts); a moment later
    they usually do. The last attempt's error, with the count, is what the user sees.
    """
    for attempt in range(1, attempts):
        try:
            return measure()
        except EngineError as exc:
            log.warning("%s (attempt %d of %d); measuring again", exc, attempt, attempts)
    try:
        return measure()
    except EngineError as exc:
        raise EngineError(f"{exc} (measured {attempts} times)") from exc


def time_decode_calls(engines: list[StageEngine], calls: int, warmup: int = 3,
                      on_call: Callable[[int], None] | None = None) -> list[float]:
    """Median seconds of a single-row decode call for each engine.

    Calls go round-robin over the engines, so machine noise spreads over every size alike, and each
    call starts as a ring member's does: with cold caches (small cuts would otherwise run from cache
    and hide the fixed cost of a call) after an idle wait (calls right after one another ran up to a
    third faster here than calls after 20 ms idle, which is how a member's calls come). The caches are
    cold when the other engines read more than EVICT_BYTES since this engine's last call (the probe's
    large-block cuts do, every round); only otherwise is a buffer read to evict them, which was a third
    of the probe's time when done before every call.
    """
    rng = np.random.default_rng(0)
    times: list[list[float]] = [[] for _ in engines]
    evict = np.ones(EVICT_BYTES // 4, np.float32)
    sizes = [engine.path.stat().st_size for engine in engines]  # about what a call reads
    since = [0] * len(engines)  # bytes read by other calls since each engine's last call
    for i in range(warmup + calls):
        for k, engine in enumerate(engines):
            x = rng.standard_normal((1, engine.n_embd)).astype(np.float32)
            rows = Rows(np.zeros(1, np.int32), np.array([i], np.int32), np.ones(1, bool))
            if since[k] < EVICT_BYTES:  # read past the caches, as a member's weights are after its neighbours ran
                evict.max()
                since = [n + evict.nbytes for n in since]
            time.sleep(IDLE_S)
            t0 = time.perf_counter()
            engine.run(x, rows)
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
            since = [n + sizes[k] for n in since]
            since[k] = 0
        if on_call:
            on_call(i + 1)
    for engine in engines:
        engine.free(0)
    return [statistics.median(t) for t in times]


def time_prefill_calls(engines: list[StageEngine], rows: int, calls: int,
                       on_call: Callable[[int], None] | None = None) -> list[float]:
    """Fastest seconds of a `rows`-row prefill call (positions 0..rows−1 of a fresh sequence) for each engine.

    Round-robin like `time_decode_calls`; no cache eviction or idle wait: a call this long is compute,
    which neither changes. The fastest of `calls` is what the machine does when nothing else runs.
    """
    rng = np.random.default_rng(1)
    best = [float("inf")] * len(engines)
    r = Rows(np.zeros(rows, np.int32), np.arange(rows, dtype=np.int32), np.zeros(rows, bool))
    for i in range(calls):
        for k, engine in enumerate(engines):
            x = rng.standard_normal((rows, engine.n_embd)).astype(np.float32)
            t0 = time.perf_counter()
            engine.run(x, r)
            best[k] = min(best[k], time.perf_counter() - t0)
            engine.free(0)
        if on_call:
            on_call(i + 1)
    return best


def time_attention(engine: StageEngine, rows: int, at: int, calls: int) -> tuple[float, float]:
    """Fastest seconds of a `rows`-row prefill call at position 0 and at position `at` (multiple of `rows`).

    The positions before `at` are filled once, untimed; between timed calls the cache is trimmed back to them.
    """
    rng = np.random.default_rng(2)

    def call(start: int) -> float:
        x = rng.standard_normal((rows, engine.n_embd)).astype(np.float32)
        r = Rows(np.zeros(rows, np.int32), np.arange(start, start + rows, dtype=np.int32), np.zeros(rows, bool))
        t0 = time.perf_counter()
        engine.run(x, r)
        return time.perf_counter() - t0

    first = float("inf")
    for _ in range(calls):
        first = min(first, call(0))
        engine.free(0)
    for start in range(0, at, rows):
        call(start)
    later = float("inf")
    for _ in range(calls):
        later = min(later, call(at))
        engine.free(0, at)
    engine.free(0)
    return first, later


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
) -> ProbeResult:
    """Measure this machine with cuts of `model` of the given block counts and, unless `large` is empty,
    cuts of those block counts of a random-weight file with large (Llama-3.1-8B-shaped) blocks, on
    `threads` threads (0: all)."""
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

        def decode_fit() -> tuple[list[float], tuple[float, float, float, float]]:
            timed_s = time_decode_calls(
                engines, calls, warmup, lambda done: on_step("timing decode calls", done, total) if on_step else None
            )
            return timed_s, fit_cost([(b, t) for (_, b), t in zip(cuts, timed_s[:len(cuts)], strict=True)], counts)

        seconds, (bandwidth, dispatch, block_s, resid) = retry_noisy(decode_fit)
        seconds, head_seconds = seconds[:len(cuts)], seconds[len(cuts):]
        # the large-block cuts and the small ones of PREFILL_SMALL blocks (the large ones come after the small)
        timed = [i for i, (n, _) in enumerate(cuts) if i >= len(sizes) or n in PREFILL_SMALL]
        if len({cuts[i][0] for i in timed if i < len(sizes)}) < 2:  # a model of few blocks: its two smallest
            timed = sorted({*range(min(2, len(sizes))), *timed})
        prefill_s = time_prefill_calls(
            [engines[i] for i in timed], prefill_rows, prefill_calls,
            lambda done: on_step("timing prefill calls", done, prefill_calls) if on_step else None)
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
    return ProbeResult(bandwidth, dispatch, usable, avail, overhead, tuple(samples), resid, head_seconds[0],
                       unembed_bw, device, device_free, block_s, tuple(counts), prefill_rows, p_bw, p_dispatch,
                       p_block, tuple(prefill), p_resid, tuple(cuts[i][0] for i in timed), unembed_fixed,
                       tuple(unembed), attn, (at_start, at_later))


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

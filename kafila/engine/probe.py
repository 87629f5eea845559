"""Self-measurement for the planner: effective bytes/s of a stage, fixed costs per call and block, usable memory.

The cost model says a decode call of a stage of `n` blocks holding `w` weight bytes takes
`o + n·p + w / b` (DESIGN §2c: every block costs a fixed ~0.1 ms of thread barriers besides its bytes).
The probe times decode calls of cuts with small blocks (the model given, usually the embedded 135M
model's 2.2 MB blocks) and with large ones (a random-weight file with Llama-3.1-8B's 123 MB blocks,
written once into the cache), and fits `o`, `p` and `b` by least squares: on small blocks alone the
per-block cost looks like bandwidth, and the fit would predict large blocks twice too slow.
A head cut (the last block with the output layer) is timed among them: what it takes beyond its
block is the unembedding, whose own quantisation and shape run at another speed than the blocks.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kafila.engine.devices import DEVICE_MARGIN, Offload
from kafila.engine.memory import available_memory, resident_memory
from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.errors import EngineError
from kafila.model.cut import StageSpec
from kafila.model.describe import describe_model
from kafila.model.random_gguf import SHAPES, Shape, cached_random_gguf
from kafila.model.stage_cache import StageCache

DEFAULT_SIZES = (1, 4, 10, 20)  # blocks per cut
LARGE_SHAPE = SHAPES["llama3-8b"]  # the large-block file's shape (kafila.model.random_gguf)
LARGE_SIZES = (1, 2)  # blocks per cut of the large-block file
SAFETY_MARGIN = 0.10  # of available memory, left for the OS and other programs
EVICT_BYTES = 128 << 20  # more than any CPU's last-level cache
IDLE_S = 0.02  # a ring member idles while the other stages compute; calls after idling run slower


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
    head_call_s: float  # median seconds per decode call of the head cut
    unembed_bandwidth_bytes_per_s: float  # unembedding bytes / its share of the head cut's call
    device: str | None = None  # the GPU the stages ran on (None: the CPU); then memory_bytes is its memory
    device_free_bytes: int | None = None
    block_s: float = 0.0  # fixed seconds per block per call (p), besides its bytes
    sample_blocks: tuple[int, ...] = ()  # blocks of each sample's cut, in the order of `samples`

    def predict(self, n_blocks: int, nbytes: int) -> float:
        """Seconds of one decode call of a stage of `n_blocks` blocks holding `nbytes`: o + n·p + bytes/b."""
        return self.dispatch_s + n_blocks * self.block_s + nbytes / self.bandwidth_bytes_per_s

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["samples"] = [list(s) for s in self.samples]
        d["sample_blocks"] = list(self.sample_blocks)
        return d


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
) -> ProbeResult:
    """Measure this machine with cuts of `model` of the given block counts and, unless `large` is empty,
    cuts of those block counts of a random-weight file with large (Llama-3.1-8B-shaped) blocks, on
    `threads` threads (0: all)."""
    info = describe_model(model)
    sizes = tuple(sorted({min(s, info.n_blocks) for s in sizes}))
    if len(sizes) < 2:
        raise EngineError("probing needs at least two different cut sizes")
    config = ContextConfig(n_ctx_per_seq=256, n_seq_max=1, n_batch=8, n_threads=threads)
    total = warmup + calls
    k = info.n_blocks
    engines: list[StageEngine] = []
    cuts = [(n, sum(info.blocks_bytes[:n])) for n in sizes]
    if large:
        if on_step:
            on_step("writing a large-block model (once)", 0, total)
        # body stages only: the stub vocabulary spares the file a real-sized embedding no one reads
        big = cached_random_gguf(large_shape, max(large), cache.root / "probe-models", tokenizer=False)
        big_info = describe_model(big)
        cuts += [(n, sum(big_info.blocks_bytes[:n])) for n in sorted(set(large))]
    try:
        for n in sizes:
            if on_step:
                on_step(f"loading a {n}-block stage", 0, total)
            engines.append(StageEngine(cache.stage(model, StageSpec(0, n, head=False)), config, final=False))
        for n in sorted(set(large)):
            if on_step:
                on_step(f"loading a {n}-block stage of large blocks", 0, total)
            engines.append(StageEngine(cache.stage(big, StageSpec(0, n, head=False)), config, final=False))
        if on_step:
            on_step("loading a head stage", 0, total)
        engines.append(StageEngine(cache.stage(model, StageSpec(k - 1, k, head=True)), config, final=True))
        # what this process holds beyond the weights: interpreter, libraries, compute buffers
        weights = sum(b for _, b in cuts) + info.blocks_bytes[-1] + info.head_bytes
        overhead = max(resident_memory() - weights, 0)
        *seconds, head_s = time_decode_calls(
            engines, calls, warmup, lambda done: on_step("timing decode calls", done, total) if on_step else None
        )
    finally:
        for engine in engines:
            engine.close()
    offload = engines[0].offload  # the first stage saw the device's memory before any stage was on it
    samples = [(nbytes, t) for (_, nbytes), t in zip(cuts, seconds, strict=True)]
    counts = [n for n, _ in cuts]
    bandwidth, dispatch, block_s, resid = fit_cost(samples, counts)
    unembed_s = head_s - (dispatch + block_s + info.blocks_bytes[-1] / bandwidth)
    # a head cut no slower than a body cut (noise, or a tiny output layer): count it at the blocks' speed
    unembed_bw = info.unembed_bytes / unembed_s if unembed_s > 0 else bandwidth
    avail = available_memory()
    usable = max(int(avail * (1 - SAFETY_MARGIN)) - overhead, 0)
    device, device_free = offload_memory(offload)
    if device_free is not None:  # weights and KV cache live on the GPU: its memory is what the planner may fill
        usable = int(device_free * (1 - DEVICE_MARGIN))
    return ProbeResult(bandwidth, dispatch, usable, avail, overhead, tuple(samples), resid, head_s, unembed_bw,
                       device, device_free, block_s, tuple(counts))


def offload_memory(offload: Offload | None) -> tuple[str | None, int | None]:
    """The GPU a probe's stages went on and its free memory before they loaded; (None, None) on the CPU."""
    if offload is None or offload.device is None or offload.device_free_bytes is None:
        return None, None
    return offload.device, offload.device_free_bytes

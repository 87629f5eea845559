"""How the probe and the benchmarks time stage calls: as a ring member's calls come (cold caches after an
idle wait) for decode, fastest of a few for prefill, and one chunk's attention to earlier positions."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from kafila.engine.stage import Rows, StageEngine

EVICT_BYTES = 128 << 20  # more than any CPU's last-level cache
IDLE_S = 0.02  # a ring member idles while the other stages compute; calls after idling run slower


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

"""Running a stage inside a ring: one llama.cpp call per activation frame, off the event loop.

The event loop keeps receiving and sending while llama.cpp computes in a worker thread. Every call goes
through that one thread, short decode steps too, although the hand-over there and back costs a hop
~280 µs: llama.cpp's OpenMP build gives each calling thread a team of its own, and with two teams on 2
cores (decode steps on the loop's thread, prompt chunks on the worker) libgomp stops spinning at its
barriers and every call of both took ~2× as long (2026-12-05: 1.8 → 3.5 ms on a Qwen3-30B-A3B block). Rows of
different requests share a call because the head packs every ready request into one frame; stages
never regroup frames, so every stage computes exactly the batches the head formed, in the same
order, and the ring's numbers equal one llama.cpp context fed those batches (llama.cpp's results
depend on which rows share a call, so regrouping per stage would make them depend on timing).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kafila.engine.stage import Rows, StageEngine
from kafila.session.protocol.frames import Frame
from kafila.session.ring.compute_turn import ComputeTurn


class StageWorker:
    """One stage engine, run in its own thread; `throttle` > 1 emulates a slower machine (a callable: one
    whose slow-down changes, read at each call).

    `turn`: the machine's compute turn, shared with the other stages on it (None: computes at will).
    """

    def __init__(self, engine: StageEngine, throttle: float | Callable[[], float] = 1.0,
                 turn: ComputeTurn | None = None) -> None:
        self.engine = engine
        self.throttle = throttle
        self.turn = turn
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafila-stage")

    async def run(self, frame: Frame, want: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """One llama.cpp call on a frame's rows; its output and the call's time in ns (throttle included)."""
        h = frame.header
        rows = Rows(np.asarray(h.seqs, np.int32), np.asarray(h.positions, np.int32),
                    want if want is not None else np.zeros(h.rows, bool))
        out, spent = await asyncio.get_running_loop().run_in_executor(self._executor, self._timed, frame.rows, rows)
        throttle = self.throttle() if callable(self.throttle) else self.throttle
        if throttle > 1.0:  # emulated slower machine: wait as long as the extra compute would take
            t0 = time.perf_counter_ns()
            await asyncio.sleep(spent * (throttle - 1.0) / 1e9)
            spent += time.perf_counter_ns() - t0
        return out, spent

    def _timed(self, embd: np.ndarray, rows: Rows) -> tuple[np.ndarray, int]:
        # timed on the stage's thread, once its turn came: the hand-over between threads and the wait
        # for another stage on this machine are not this stage's compute (nor multiplied by a throttle)
        with self.turn or contextlib.nullcontext():
            t0 = time.perf_counter_ns()
            return self.engine.run(embd, rows), time.perf_counter_ns() - t0

    async def free(self, seq: int, keep: int = 0) -> None:
        """Drop a sequence's KV cache from position `keep` on (0: all of it)."""
        # on the stage's thread, so it never races a running call
        await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.free, seq, keep)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.close()
        if self.turn is not None:
            self.turn.close()

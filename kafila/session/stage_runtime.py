"""Running a stage inside a ring: frames waiting at a stage share one llama.cpp call, off the event loop.

The event loop keeps receiving and sending while llama.cpp computes in a worker thread, so frames
that arrive meanwhile queue up and go into the next call together (rows of different requests, each
in its own KV-cache sequence).
"""

from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kafila.engine.stage import Rows, StageEngine
from kafila.net import frames
from kafila.net.frames import ActivationHeader
from kafila.session import messages


class Inbox:
    """An in-order message queue whose head can be inspected (asyncio.Queue cannot peek)."""

    def __init__(self) -> None:
        self._items: collections.deque[bytes] = collections.deque()
        self._event = asyncio.Event()

    def put(self, msg: bytes) -> None:
        self._items.append(msg)
        self._event.set()

    async def get(self) -> bytes:
        while not self._items:
            self._event.clear()
            await self._event.wait()
        return self._items.popleft()

    def peek(self) -> bytes | None:
        return self._items[0] if self._items else None

    def pop(self) -> bytes:
        return self._items.popleft()


@dataclass(frozen=True)
class Frame:
    """A decoded activation frame."""

    header: ActivationHeader
    rows: np.ndarray

    @classmethod
    def decode(cls, msg: bytes) -> Frame:
        header, payload = frames.decode(msg)
        return cls(header, frames.rows_array(header, payload))

    def encode(self, rows: np.ndarray, extra_time_ns: int) -> bytes:
        h = self.header
        out = ActivationHeader(h.request_id, h.phase, h.positions, rows.shape[0], rows.shape[1], h.dtype,
                               (*h.stage_times_ns, extra_time_ns))
        return frames.encode(out, rows)


class StageWorker:
    """One stage engine, run in its own thread; `throttle` > 1 emulates a slower machine."""

    def __init__(self, engine: StageEngine, throttle: float = 1.0) -> None:
        self.engine = engine
        self.throttle = throttle
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafila-stage")

    async def run(self, batch: list[Frame], want: np.ndarray | None = None) -> tuple[list[np.ndarray], int]:
        """Run several frames in one call; per-frame outputs and the call's time in ns (throttle included)."""
        x = np.concatenate([f.rows for f in batch]) if len(batch) > 1 else batch[0].rows
        seq = np.concatenate([np.full(f.header.rows, f.header.request_id, np.int32) for f in batch])
        pos = np.concatenate([np.asarray(f.header.positions, np.int32) for f in batch])
        rows = Rows(seq, pos, want if want is not None else np.zeros(len(seq), bool))
        t0 = time.perf_counter_ns()
        out = await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.run, x, rows)
        spent = time.perf_counter_ns() - t0
        if self.throttle > 1.0:  # emulated slower machine: wait as long as the extra compute would take
            await asyncio.sleep(spent * (self.throttle - 1.0) / 1e9)
        total = time.perf_counter_ns() - t0
        if self.engine.final:
            return [out], total  # logits of the wanted rows, in order; the head splits them
        bounds = np.cumsum([f.header.rows for f in batch])[:-1]
        return np.split(out, bounds), total

    async def free(self, seq: int) -> None:
        # on the stage's thread, so it never races a running call
        await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.free, seq)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.close()


def take_frames(inbox: Inbox, first: bytes, max_rows: int) -> list[Frame]:
    """`first` plus the frames directly behind it in the inbox, up to `max_rows` rows in all."""
    batch = [Frame.decode(first)]
    rows = batch[0].header.rows
    while (nxt := inbox.peek()) is not None and messages.kind(nxt) == "frame":
        f = Frame.decode(nxt)
        if rows + f.header.rows > max_rows:
            break
        inbox.pop()
        batch.append(f)
        rows += f.header.rows
    return batch

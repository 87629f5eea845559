"""Running a stage inside a ring: one llama.cpp call per activation frame, off the event loop.

The event loop keeps receiving and sending while llama.cpp computes in a worker thread. Every call goes
through that one thread, short decode steps too: llama.cpp's OpenMP build gives each calling thread a
team of its own, and with two teams on 2 cores (decode steps on the loop's thread, prompt chunks on the
worker) libgomp stops spinning at its barriers and every call of both took ~2× as long (2026-12-05:
1.8 → 3.5 ms on a Qwen3-30B-A3B block). A short decode step is waited for right here, the loop blocked:
its end then wakes this thread directly instead of through the loop (its self-pipe, selector, future
callbacks and a task step), which cut a Qwen3-30B-A3B-shaped ring's time outside llama.cpp from ~2.9 to
~2.45 ms a token (three runs each). Rows of
different requests share a call because the head packs every ready request into one frame; stages
never regroup frames, so every stage computes exactly the batches the head formed, in the same
order, and the ring's numbers equal one llama.cpp context fed those batches (llama.cpp's results
depend on which rows share a call, so regrouping per stage would make them depend on timing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from kafila.engine.stage import Rows, StageEngine
from kafila.errors import SessionEnded
from kafila.net.quic import Link
from kafila.session.protocol import frames, messages
from kafila.session.protocol.authority import RingView, Sender, Via, refusal
from kafila.session.protocol.frames import Frame, Phase
from kafila.session.ring.compute_turn import ComputeTurn
from kafila.session.ring.frame_check import Cursors, FrameLimits, from_neighbour

# A decode step whose last one took less than this is waited for with the event loop blocked. The loop then
# neither reads nor acknowledges for that long: far below a link's idle timeout (5 s); past ~25 ms a sender
# may send a probe packet meanwhile, which costs a datagram, not the link.
BLOCKING_NS = 50_000_000
# ... but at most this long: a step that overruns it is waited for through the loop. On a machine whose cores
# were shared eight ways one step took 7 s, and every link of its process timed out while the loop was blocked.
BLOCK_AT_MOST_S = 0.5

T = TypeVar("T")
log = logging.getLogger("kafila.member")


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
        self._queued = 0  # calls handed to the worker thread through the loop and not yet back
        self._decode_ns: int | None = None  # the last decode step's time
        self._overslept_s = 0.0  # how much longer than asked the emulated slow-down's waits took so far

    async def run(self, frame: Frame, want: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """One llama.cpp call on a frame's rows; its output and the call's time in ns (throttle included)."""
        h = frame.header
        rows = Rows(np.asarray(h.seqs, np.int32), np.asarray(h.positions, np.int32),
                    want if want is not None else np.zeros(h.rows, bool), np.asarray(h.steps) if h.steps else None)
        short = h.phase == Phase.DECODE and self._decode_ns is not None and self._decode_ns < BLOCKING_NS
        done = await self._blocking(frame.rows, rows) if short else None
        out, spent = done if done is not None else await self._through_loop(self._timed, frame.rows, rows)
        if h.phase == Phase.DECODE:
            self._decode_ns = spent
        throttle = self.throttle() if callable(self.throttle) else self.throttle
        if throttle > 1.0:  # emulated slower machine: wait as long as the extra compute would take
            spent += await self._wait_extra(spent * (throttle - 1.0))
        return out, spent

    async def _wait_extra(self, ns: float) -> int:
        """Wait `ns` more (an emulated slow-down's), less what earlier waits overslept; returns the ns waited.

        The event loop wakes a sleeper up to a millisecond late (epoll's timeout is whole milliseconds): a
        4× slow-down then added ~1 ms a call whatever the call's size, so a member given fewer blocks for it
        ran a third slower than a machine 4× slower would (the planner scales every time by the slow-down).
        Carrying the overshoot into the next wait keeps the waits at their sum."""
        want = ns / 1e9 - self._overslept_s
        if want <= 0:
            self._overslept_s = -want
            return 0
        t0 = time.perf_counter_ns()
        await asyncio.sleep(want)
        waited = time.perf_counter_ns() - t0
        self._overslept_s = max(waited / 1e9 - want, 0.0)
        return waited

    async def _blocking(self, embd: np.ndarray, rows: Rows) -> tuple[np.ndarray, int] | None:
        """The call on the worker thread, waited for with the loop blocked for BLOCK_AT_MOST_S at most, then through
        the loop; None when the worker has calls queued or another stage on this machine holds the cores (the loop
        must not wait behind them)."""
        turn = self.turn
        if self._queued or (turn is not None and not turn.try_take()):
            return None
        call = self._executor.submit(self._timed, embd, rows, False)
        if turn is not None:  # released when the call ends, on whichever thread sees it end
            call.add_done_callback(lambda _: turn.release())
        try:
            return call.result(timeout=BLOCK_AT_MOST_S)
        except TimeoutError:
            self._queued += 1
            try:
                return await asyncio.wrap_future(call)
            finally:
                self._queued -= 1

    async def _through_loop(self, fn: Callable[..., T], *args: object) -> T:
        self._queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._queued -= 1

    def _in_turn(self) -> contextlib.AbstractContextManager[object]:
        """The machine's compute turn, held for the block (nothing to hold on a machine of its own)."""
        return self.turn if self.turn is not None else contextlib.nullcontext()

    def _timed(self, embd: np.ndarray, rows: Rows, take_turn: bool = True) -> tuple[np.ndarray, int]:
        # timed on the stage's thread, once its turn came: the hand-over between threads and the wait
        # for another stage on this machine are not this stage's compute (nor multiplied by a throttle)
        with self._in_turn() if take_turn else contextlib.nullcontext():
            t0 = time.perf_counter_ns()
            return self.engine.run(embd, rows), time.perf_counter_ns() - t0

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the stage's thread in the machine's compute turn, the loop blocked until it ends: the draft
        model's calls (llama.cpp must be called from one thread, see above)."""
        def turned() -> T:
            with self._in_turn():
                return fn()
        return self._executor.submit(turned).result()

    async def free(self, seq: int, keep: int = 0) -> None:
        """Drop a sequence's KV cache from position `keep` on (0: all of it)."""
        # on the stage's thread, so it never races a running call
        await self._through_loop(self.engine.free, seq, keep)

    async def fork(self, src: int, seq: int, keep: int) -> None:
        """Make sequence `seq` a copy of `src`'s positions before `keep` (a prompt another request computed)."""
        await self._through_loop(self.engine.fork, src, seq, keep)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.close()
        if self.turn is not None:
            self.turn.close()


async def pump(link: Link, inbox: asyncio.Queue[bytes], ring: RingView) -> None:
    """Move every message arriving on the ring edge `link` into `inbox` until the link fails; a control message
    its sender may not send is logged and dropped, never handled nor passed on (protocol.authority)."""
    sender = Sender(link.peer.name, Via.RING)
    while True:
        msg = await link.recv()
        if messages.kind(msg) == "control" and (refused := refusal(sender, from_neighbour(messages.decode, msg), ring)):
            log.warning("refused %s", refused)
            continue
        inbox.put_nowait(msg)


async def relay(worker: StageWorker, inbox: asyncio.Queue[bytes], nxt: Link, limits: FrameLimits,
                deliver: Callable[[messages.ChatEvt], bool]) -> None:
    """A stage that is not the head: compute each frame from the predecessor and pass it on, with the ring's
    control messages; `deliver` takes a chat event for this member's own API (True: it was one of its requests).
    The predecessor's frames are checked before llama.cpp sees them: a bad one is its fault (frame_check.py)."""
    cursors = Cursors(limits)
    while True:
        msg = await inbox.get()
        if messages.kind(msg) == "frame":
            frame = from_neighbour(frames.decode, msg)
            cursors.frame(frame)
            out, ns = await worker.run(frame)
            await nxt.send(frames.encode(frame.passed(out, ns)))
            continue
        c = from_neighbour(messages.decode, msg)
        if isinstance(c, messages.Bye):
            raise SessionEnded(c.reason)
        if isinstance(c, messages.Free):
            cursors.drop(c.seq)
            await worker.free(c.seq)
        elif isinstance(c, messages.Trim):
            cursors.drop(c.seq, c.keep)
            await worker.free(c.seq, c.keep)
        elif isinstance(c, messages.Fork):
            cursors.fork(c.src, c.seq, c.keep)
            await worker.fork(c.src, c.seq, c.keep)
        elif isinstance(c, messages.ChatEvt) and deliver(c):
            continue
        await nxt.send(msg)  # free, chat and others' chat_evt travel on around the ring

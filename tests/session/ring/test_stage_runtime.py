"""The stage worker: every llama.cpp call on its one thread (a second calling thread would give llama.cpp's
OpenMP build a second team and halve its speed on 2 cores), a short decode step waited for with the event
loop blocked (its end wakes the caller directly), and never a wait on the loop behind a prompt chunk, a
free, or another stage's turn on the machine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.model.cut import StageSpec
from kafila.model.stage_cache import StageCache
from kafila.session.protocol.frames import ActivationHeader, Frame, Phase
from kafila.session.ring import stage_runtime
from kafila.session.ring.compute_turn import ComputeTurn
from kafila.session.ring.stage_runtime import StageWorker

pytestmark = pytest.mark.fast


class Recording(StageEngine):
    """A real stage engine that notes the thread of each call."""

    threads: list[int]

    def run(self, embd: np.ndarray, rows: Rows) -> np.ndarray:
        self.threads.append(threading.get_ident())
        return super().run(embd, rows)


@pytest.fixture
def body(smollm: Path, stage_cache: StageCache) -> Iterator[Recording]:
    path = stage_cache.stage(smollm, StageSpec(0, 10, False))
    engine = Recording(path, ContextConfig(n_ctx_per_seq=256, n_seq_max=1, n_batch=32, n_threads=1), False)
    engine.threads = []
    yield engine
    engine.close()


def frame(engine: StageEngine, phase: Phase, start: int, n: int = 1) -> Frame:
    rows = np.random.default_rng(start).standard_normal((n, engine.n_embd)).astype(np.float32)
    return Frame(ActivationHeader(start, phase, tuple(range(start, start + n)), n, engine.n_embd, seqs=(0,) * n), rows)


async def yielded(call: Awaitable[object]) -> bool:
    """Whether the event loop ran anything else while `call` was awaited."""
    ran = asyncio.Event()
    other = asyncio.get_running_loop().call_soon(ran.set)
    await call
    other.cancel()
    return ran.is_set()


def test_short_decode_steps_block_the_loop_and_every_call_runs_on_the_worker_thread(body: Recording) -> None:
    async def go() -> list[bool]:
        worker = StageWorker(body)
        out = [await yielded(worker.run(frame(body, Phase.PREFILL, 0, 20)))]
        out += [await yielded(worker.run(frame(body, Phase.DECODE, pos))) for pos in range(20, 24)]
        worker.close()
        return out

    # the chunk and the first decode step (its time not yet known) through the loop, the rest blocking
    assert asyncio.run(go()) == [True, True, False, False, False]
    assert len(body.threads) == 5 and threading.get_ident() not in body.threads and len(set(body.threads)) == 1


def test_a_slow_decode_step_and_a_pending_free_go_through_the_loop(
        body: Recording, monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> list[bool]:
        worker = StageWorker(body)
        await worker.run(frame(body, Phase.PREFILL, 0, 8))
        await worker.run(frame(body, Phase.DECODE, 8))
        monkeypatch.setattr(stage_runtime, "BLOCKING_NS", 1)  # every step is "long" now
        out = [await yielded(worker.run(frame(body, Phase.DECODE, 9)))]
        monkeypatch.undo()
        out.append(await yielded(worker.run(frame(body, Phase.DECODE, 10))))  # short again
        freeing = asyncio.ensure_future(worker.free(0, 12))
        await asyncio.sleep(0)  # the free is queued on the worker: the step waits its turn there, not blocking
        out.append(await yielded(worker.run(frame(body, Phase.DECODE, 11))))
        await freeing
        out.append(await yielded(worker.run(frame(body, Phase.DECODE, 12))))  # nothing queued: blocking
        worker.close()
        return out

    assert asyncio.run(go()) == [True, False, True, False]


def test_a_short_step_that_overruns_is_waited_for_through_the_loop(body: Recording,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose cores are shared many ways can stall a step that was short: the loop, blocked on it, would
    read no link meanwhile (one stalled 7 s, and every link of its process timed out)."""
    run = body.run

    def stalling(embd: np.ndarray, rows: Rows) -> np.ndarray:
        time.sleep(0.6)  # as a llama.cpp call whose threads are descheduled would
        return run(embd, rows)

    async def go() -> list[bool]:
        worker = StageWorker(body)
        await worker.run(frame(body, Phase.PREFILL, 0, 8))
        await worker.run(frame(body, Phase.DECODE, 8))
        out = [await yielded(worker.run(frame(body, Phase.DECODE, 9)))]  # short: blocking
        monkeypatch.setattr(body, "run", stalling)
        monkeypatch.setattr(stage_runtime, "BLOCK_AT_MOST_S", 0.1)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        out.append(await yielded(worker.run(frame(body, Phase.DECODE, 10))))  # overran: through the loop
        ticking.cancel()
        out.append(ticks > 10)  # the loop ran all along (0.5 s past the bound)
        worker.close()
        return out

    assert asyncio.run(go()) == [False, True, True]


def test_a_decode_step_never_blocks_the_loop_behind_another_stages_turn(body: Recording, tmp_path: Path) -> None:
    mine, other = ComputeTurn(tmp_path), ComputeTurn(tmp_path)

    async def go() -> list[bool]:
        worker = StageWorker(body, turn=mine)
        await worker.run(frame(body, Phase.PREFILL, 0, 8))
        await worker.run(frame(body, Phase.DECODE, 8))
        assert other.try_take()  # another stage on this machine computes
        step = asyncio.ensure_future(worker.run(frame(body, Phase.DECODE, 9)))
        await asyncio.sleep(0.2)
        assert not step.done(), "the step computed while another stage held the machine's turn"
        other.release()
        await step
        out = [await yielded(worker.run(frame(body, Phase.DECODE, 10)))]  # the turn free: blocking
        worker.close()
        return out

    try:
        assert asyncio.run(go()) == [False]
    finally:
        mine.close()
        other.close()


def test_an_emulated_slow_down_waits_its_sum_whatever_the_loop_overslept(body: Recording) -> None:
    # the loop wakes a sleeper up to a millisecond late: each wait takes what earlier ones overslept off,
    # so the waits add up to the slow-down's (plus only the last one's overshoot), not a millisecond a call more
    asked = [1_300_000 + 50_000 * (i % 5) for i in range(30)]  # ns: a 4x slow-down of ~0.4 ms calls

    async def go() -> tuple[list[int], float]:
        worker = StageWorker(body, throttle=4.0)
        waited = [await worker._wait_extra(ns) for ns in asked]
        return waited, worker._overslept_s

    waited, owed = asyncio.run(go())
    # waits that did not take earlier late wakes off would add every one of them (30 of up to a millisecond) to
    # the sum; `owed`, the last wake's lateness, depends on the machine's load and is not bounded here
    assert sum(waited) / 1e9 == pytest.approx(sum(asked) / 1e9 + owed, abs=1e-4), (waited, owed)

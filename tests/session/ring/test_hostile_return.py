"""What comes back round the ring to the head is checked against what the head sent (issue 34 item 4): a free of
a slot it never freed (before: the slot was added twice, and two requests would share one KV sequence) and a
frame whose sequences or positions were changed on the way (before: it went into the head's llama.cpp call, or
left the head failing every request for good without reporting a loss) end the head's run with
NeighbourFault, which the member reports as its predecessor's loss (test_hostile_neighbour.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kafila.engine.embedding import Embedder
from kafila.engine.stage import ContextConfig, StageEngine
from kafila.engine.vocab import Vocab
from kafila.errors import NeighbourFault
from kafila.model.cut import StageSpec
from kafila.model.gguf_file import GGUFFile
from kafila.model.stage_cache import StageCache
from kafila.session.protocol import frames, messages
from kafila.session.protocol.frames import Frame
from kafila.session.ring.head import Head
from kafila.session.ring.stage_runtime import StageWorker

pytestmark = pytest.mark.fast


@contextlib.asynccontextmanager
async def head_of_two(model: Path, cache: StageCache) -> AsyncIterator[tuple[Head, asyncio.Task[None], list[bytes]]]:
    """A running head (blocks [20, 30)) whose next stage is the test: what it sends, collected."""
    path = cache.stage(model, StageSpec(20, 30, True))
    config = ContextConfig(n_ctx_per_seq=256, n_seq_max=2, n_batch=32, n_threads=1)
    worker = StageWorker(await asyncio.to_thread(StageEngine, path, config, True))
    sent: list[bytes] = []

    async def send(msg: bytes) -> None:
        sent.append(msg)

    h = Head(worker, Embedder(path), Vocab(worker.engine.vocab, GGUFFile(path).get("tokenizer.chat_template")),
             config, ["ada", "bo"], {}, send, asyncio.Queue())
    task = asyncio.create_task(h.run())
    try:
        yield h, task, sent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(worker.close)


async def fault_of(task: asyncio.Task[None]) -> BaseException:
    with pytest.raises(BaseExceptionGroup) as caught:
        await asyncio.wait_for(task, 30)
    faults = caught.value.subgroup(NeighbourFault)
    assert faults is not None, caught.value
    return faults.exceptions[0]


async def test_a_free_of_a_slot_the_head_never_freed_is_a_neighbour_fault(smollm: Path,
                                                                          stage_cache: StageCache) -> None:
    async with head_of_two(smollm, stage_cache) as (h, task, _):
        h.inbox.put_nowait(messages.encode(messages.Free(1)))
        assert "a free of slot 1 came round, which the head did not free" in str(await fault_of(task))


async def test_a_frame_back_with_other_sequences_is_a_neighbour_fault(smollm: Path, stage_cache: StageCache) -> None:
    async with head_of_two(smollm, stage_cache) as (h, task, sent):
        asker = asyncio.create_task(anext(h.chat({"messages": [{"role": "user", "content": "Hi"}]})))
        while not sent:
            await asyncio.sleep(0.01)
        frame = frames.decode(sent[0])
        changed = replace(frame.header, seqs=tuple(1 - s for s in frame.header.seqs))  # slot 0 <-> 1
        h.inbox.put_nowait(frames.encode(Frame(changed, frame.rows)))
        assert "came back with other sequences or positions" in str(await fault_of(task))
        asker.cancel()
        await asyncio.gather(asker, return_exceptions=True)


@pytest.mark.parametrize("case", ["nan", "width"])
async def test_a_frame_back_with_nan_or_another_width_is_a_neighbour_fault(smollm: Path, stage_cache: StageCache,
                                                                          case: str) -> None:
    # issue 55, finding 2: before, the head's own llama.cpp call took the NaN rows, or refused the width and the
    # head's member reported itself lost
    async with head_of_two(smollm, stage_cache) as (h, task, sent):
        asker = asyncio.create_task(anext(h.chat({"messages": [{"role": "user", "content": "Hi"}]})))
        while not sent:
            await asyncio.sleep(0.01)
        frame = frames.decode(sent[0])
        rows = np.array(frame.rows)
        if case == "nan":
            rows[0, 0] = np.nan
        else:
            rows = rows[:, :7]
        back = Frame(replace(frame.header, width=rows.shape[1]), rows)
        h.inbox.put_nowait(frames.encode(back))
        words = "not finite" if case == "nan" else "has rows of width 7; the model's is 576"
        assert words in str(await fault_of(task))
        asker.cancel()
        await asyncio.gather(asker, return_exceptions=True)

"""A ring of one for head tests: the whole model as the head's stage, in this process, on real llama.cpp."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from kafila.engine.embedding import Embedder
from kafila.engine.stage import ContextConfig, StageEngine
from kafila.engine.vocab import Vocab
from kafila.model.cut import StageSpec
from kafila.model.gguf_file import GGUFFile
from kafila.model.stage_cache import StageCache
from kafila.session.api.server import ApiServer
from kafila.session.ring.head import Head
from kafila.session.ring.stage_runtime import StageWorker
from tests.session.api_fixtures import admitted_state

N_CTX = 512  # the head tests' context per request (tests/session/ring/conftest.py's `head`)


@contextlib.asynccontextmanager
async def solo_head(model: Path, cache: StageCache, n_ctx: int, n_blocks: int = 30, n_seq: int = 2,
                    chat_template: str | None = None) -> AsyncIterator[Head]:
    """A running head over blocks [0, n_blocks) with `n_seq` slots (`chat_template`: in place of the model's, as
    the host's --chat-template); on exit it must still be running (a test's requests did not stop it), then it
    is stopped."""
    path = cache.stage(model, StageSpec(0, n_blocks, True))
    config = ContextConfig(n_ctx_per_seq=n_ctx, n_seq_max=n_seq, n_batch=128, n_threads=2)
    engine = await asyncio.to_thread(StageEngine, path, config, True)
    worker = StageWorker(engine)
    vocab = Vocab(engine.vocab, chat_template or GGUFFile(path).get("tokenizer.chat_template"))
    h = Head(worker, Embedder(path), vocab, config, ["solo"], {}, None, asyncio.Queue())
    task = asyncio.create_task(h.run())
    await asyncio.sleep(0)
    try:
        yield h
        assert not task.done(), f"the head stopped: {task.exception() if task.done() else ''}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(worker.close)


@contextlib.contextmanager
def served_head(model: Path, cache: StageCache, n_seq: int = 2) -> Iterator[ApiServer]:
    """An ApiServer whose ring is a running solo head of `n_seq` slots, on its own event loop in a thread (for
    synchronous clients: the openai package)."""
    loop = asyncio.new_event_loop()
    started, box = threading.Event(), {}
    stop = asyncio.Event()

    async def serve() -> None:
        async with solo_head(model, cache, N_CTX, n_seq=n_seq) as head:
            server = ApiServer(admitted_state(), port=0)
            server.chat = head.chat
            await server.start()
            box["server"] = server
            started.set()
            await stop.wait()
            await server.stop()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert started.wait(120), "the API server did not start"
    try:
        yield box["server"]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        loop.close()

"""A member's side of a model copy (delivery.model_copy_sender): the whole model file, received in the background.

The member asks for COPY_BATCH chunks at a time and the next batch once those are verified and written
(on a worker thread: the ring's frames go on meanwhile), so the copy never runs ahead of the control
messages sharing its link by more than a batch. What reads the whole file (checking what a `.part` already
holds, verifying the finished copy) runs on a task of its own, never in the control loop: chats and
re-plans do not wait for it. A copy chunk that arrives while a stage is being received is dropped there
(transfer.receive_stage's `aside`), as is one this member did not ask for; the host's next `copy` (at
each admission) resumes from the `.part` file. Once the whole file verifies the member says so (`copied`)
and keeps its path: it can take coordination over with it (member.takeover). When the session has public URLs
of the model (`kafila host --source`), the copy is fetched from them instead, into the store that holds this
member's stage chunks already (model_chunks.ChunkStore), and asked of the host only if they cannot bring it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from kafila.errors import DiskFullError, KafilaError, ProtocolError
from kafila.model.stage_cache import StageCache
from kafila.net.rate import RateQueue
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.delivery.model_chunks import ChunkStore
from kafila.session.delivery.stage_fetch import fetch_from_urls
from kafila.session.delivery.stage_files import StageReceiver, megabytes
from kafila.session.protocol import messages
from kafila.session.protocol.chunks import COPY_BATCH, COPY_MAGIC, parse_chunk
from kafila.session.protocol.manifest import StageManifest
from kafila.session.protocol.model_manifest import ModelSource
from kafila.session.state import SessionState
from kafila.session.stoppable import run_stoppable

log = logging.getLogger("kafila.member")


class ModelCopy:
    """Receiving a copy of the model into the cache; `model_copy` is the verified one. A part of the member
    (runtime.py), handed how to reach the coordinator (`send_host`) and to start a task of its own (`spawn`)."""

    def __init__(self, me: str, state: SessionState, cache: StageCache, use: InUse | None,
                 send_host: Callable[[messages.Control], Awaitable[None]],
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
                 downlink: RateQueue | None = None) -> None:
        self.me, self.state, self.cache, self.use, self.send_host, self.spawn = me, state, cache, use, send_host, spawn
        self.downlink = downlink  # EMULATION: the member's emulated downlink, which downloads from URLs pass
        self.model_copy: Path | None = None  # a verified copy of the model the host gave
        self._copy: StageReceiver | None = None  # the copy being received (None: none, or it is whole)
        self._copy_task: asyncio.Task[None] | None = None  # its start or its final check, off the control loop
        self._copy_todo: list[int] = []  # chunks not yet asked for, in order
        self._copy_asked: set[int] = set()  # the batch asked for and not yet all here

    def offer(self, manifest: StageManifest, source: ModelSource | None = None) -> None:
        """The host offers a copy of the model (again at each admission until it is held); with the session's public
        URLs of it (`source`), the copy comes from them, and from the host only if they cannot bring it all."""
        self._copy = None  # a copy under way starts over: chunks in flight for it are dropped
        if self._copy_task is not None:
            self._copy_task.cancel()
        if source is not None and source.manifest.sha256 == manifest.sha256:
            self._copy_task = self.spawn(self._copy_from_urls(manifest, source))
        else:
            self._copy_task = self.spawn(self._start_copy(manifest))

    async def _copy_from_urls(self, manifest: StageManifest, source: ModelSource) -> None:
        """Every chunk of the model from the public URLs into the store that holds this member's stage chunks
        already, each checked against the host's manifest; what they cannot bring comes from the host."""
        try:
            store = ChunkStore(self.cache.root / "models", source.manifest)
            if self.use is not None:
                for path in store.files:
                    self.use.add(path)
            if not store.complete:
                self.state.log(f"fetching a copy of the model ({megabytes(manifest.size)}) from "
                               f"{', '.join(source.urls)} in the background, so that the session outlives its host")
                await fetch_from_urls(store, source.urls, tell=self.state.log, downlink=self.downlink)
            self.model_copy = await run_stoppable(lambda progress: store.finish())
        except (KafilaError, OSError) as exc:
            self.state.log(f"{exc}; the copy comes from the host instead")
            await self._start_copy(manifest)
            return
        await self._copied(manifest)

    async def _start_copy(self, manifest: StageManifest) -> None:
        """Check what the `.part` already holds and the space for the rest, then ask for the first batch (nothing
        left: verify the whole file and say it is held)."""
        try:
            receiver = StageReceiver(self.cache.root / "copies", manifest)
            if self.use is not None:
                for path in (receiver.part, receiver.final):
                    self.use.add(path)
            self._copy_todo = await run_stoppable(receiver.missing)
            receiver.check_space()
        except (DiskFullError, OSError) as exc:
            await self._give_copy_up(f"{self.me} cannot hold a copy: {exc}")
            return
        self._copy, self._copy_asked = receiver, set()
        self.state.log(f"receiving a copy of the model ({megabytes(manifest.size)}) in the background, so that the "
                       f"session outlives its host")
        with contextlib.suppress(KafilaError):  # the host gone: the control loop finds out
            await self._ask_copy()

    async def chunk(self, raw: bytes) -> None:
        receiver = self._copy
        try:
            index, data = parse_chunk(raw, COPY_MAGIC)
        except ProtocolError as exc:
            log.warning("ignored a malformed model-copy chunk: %s", exc)
            return
        if receiver is None or index not in self._copy_asked:
            return  # a copy given up or started over, or a chunk not asked for: nothing to store
        try:
            await asyncio.to_thread(receiver.accept, index, data)
        except (DiskFullError, ProtocolError, OSError) as exc:
            await self._give_copy_up(str(exc))
            return
        self._copy_asked.discard(index)
        if not self._copy_asked:
            await self._ask_copy()

    async def _ask_copy(self) -> None:
        """Ask for the next batch the copy lacks; once none is left, verify the whole file."""
        receiver = self._copy
        assert receiver is not None
        while self._copy_todo:
            batch = [i for i in self._copy_todo[:COPY_BATCH] if i not in receiver.have]
            del self._copy_todo[:COPY_BATCH]
            if batch:
                self._copy_asked = set(batch)
                await self.send_host(messages.CopyNeed(tuple(batch)))
                return
        self._copy = None
        self._copy_task = self.spawn(self._finish_copy(receiver))

    async def _finish_copy(self, receiver: StageReceiver) -> None:
        try:
            self.model_copy = await run_stoppable(receiver.finish)
        except (KafilaError, OSError) as exc:
            await self._give_copy_up(str(exc))
            return
        await self._copied(receiver.manifest)

    async def _copied(self, manifest: StageManifest) -> None:
        self.state.log(f"this machine holds a copy of the model ({megabytes(manifest.size)}): it can take "
                       f"coordination over if the host is lost")
        with contextlib.suppress(KafilaError):
            await self.send_host(messages.Copied(manifest.sha256, None))

    async def _give_copy_up(self, why: str) -> None:
        self._copy = None
        self.state.log(f"no copy of the model on this machine: {why}")
        with contextlib.suppress(KafilaError):
            await self.send_host(messages.Copied(None, why))

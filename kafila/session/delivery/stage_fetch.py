"""The member's side of delivery from any source: the scheduler's requests run, their chunks verified and stored.

fetch_chunks pumps a ChunkScheduler (sans-I/O) over real sources until every wanted chunk is in the
ChunkStore: it starts a task per request, hands each result to the store (which checks its sha256
against the host's model manifest) and tells the scheduler what became of it. A chunk that fails its
hash drops its source for the session (ChunkRefused names it); a network failure rests the source; a
stall is the scheduler's to notice (poll), and the stalled request's task keeps running, so a chunk it
brings late is still stored. fetch_stage reads the header first, then the chunks its stage needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

from kafila.errors import NetworkError, SessionError
from kafila.model.cut import StageSpec
from kafila.net.rate import RateQueue
from kafila.session.delivery.chunk_scheduler import ChunkScheduler, Kind, Request
from kafila.session.delivery.model_chunks import ChunkRefused, ChunkStore
from kafila.session.delivery.stage_chunks import cut_and_check, header_wanted, read_header, stage_chunks
from kafila.session.delivery.url_source import UrlRefused, UrlSource
from kafila.session.protocol.manifest import StageManifest
from kafila.session.stoppable import run_stoppable

log = logging.getLogger("kafila.delivery")
_IDLE_S = 1.0  # the longest wait between two looks at the scheduler when it names no wake-up


class ChunkSource(Protocol):
    """Anything that serves the model's chunks: a URL (UrlSource), a peer, the host."""

    name: str

    async def fetch(self, index: int) -> bytes: ...


async def fetch_chunks(store: ChunkStore, scheduler: ChunkScheduler, sources: Mapping[str, ChunkSource],
                       clock: Callable[[], float] | None = None, tell: Callable[[str], None] = log.warning,
                       patient: bool = True) -> None:
    """Run `scheduler`'s requests over `sources` until every chunk it wants is in `store`; SessionError when no
    source can bring what is left (`patient`: after waiting for resting sources; else at once, as when the host
    can send the rest). `tell` hears each source dropped or rested, once."""
    now = clock or asyncio.get_running_loop().time
    running: dict[asyncio.Task[bytes], Request] = {}
    told = len(scheduler.log)
    try:
        while not scheduler.complete:
            scheduler.poll(now())
            for r in scheduler.next_requests(now()):
                running[asyncio.create_task(sources[r.source].fetch(r.chunk))] = r
            for line in scheduler.log[told:]:
                tell(line)
            told = len(scheduler.log)
            if not running:
                if scheduler.unreachable(now()) and (not patient or scheduler.next_wakeup(now()) is None):
                    raise SessionError(f"no source can send {len(scheduler.unreachable(now()))} chunks of the model "
                                       f"(every source holding them was dropped)")
            wake = scheduler.next_wakeup(now())
            timeout = _IDLE_S if wake is None else min(max(wake - now(), 0.0), _IDLE_S)
            if running:
                done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            else:
                done = set()
                await asyncio.sleep(timeout)
            for task in done:
                await _settle(store, scheduler, running.pop(task), task, now())
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def _settle(store: ChunkStore, scheduler: ChunkScheduler, r: Request, task: asyncio.Task[bytes],
                  now: float) -> None:
    """One finished request: its chunk stored (after its hash) and the scheduler told."""
    exc = task.exception()
    if exc is None:
        data = task.result()
        try:  # hashed and written off the loop: a copy fetched while the ring serves must not hold its frames up
            await asyncio.to_thread(store.accept, r.chunk, data, r.source)
        except ChunkRefused:
            scheduler.refused(r.source, r.chunk)
            return
        scheduler.received(r.source, r.chunk, len(data), now)
    elif isinstance(exc, UrlRefused):  # it serves another file: as good as a lie
        scheduler.refused(r.source, r.chunk, str(exc))
    elif isinstance(exc, (NetworkError, OSError, asyncio.TimeoutError)):
        scheduler.failed(r.source, r.chunk, now, str(exc))
    else:
        raise exc


async def fetch_stage(store: ChunkStore, spec: StageSpec, scheduler: ChunkScheduler,
                      sources: Mapping[str, ChunkSource], tell: Callable[[str], None] = log.warning,
                      patient: bool = True) -> list[int]:
    """Every chunk `spec`'s cut reads into `store`: the header first (its length is learnt from it), then the
    stage's tensors'. Returns the stage's chunks."""
    while want := header_wanted(store):
        scheduler.want(want)
        await fetch_chunks(store, scheduler, sources, tell=tell, patient=patient)
    header = read_header(store)
    assert header is not None  # header_wanted is empty only once it parses
    needed = stage_chunks(header, store.manifest, spec)
    scheduler.want(store.missing(needed))
    await fetch_chunks(store, scheduler, sources, tell=tell, patient=patient)
    return needed


async def fetch_from_urls(store: ChunkStore, urls: Sequence[str], tell: Callable[[str], None] = log.warning,
                          spec: StageSpec | None = None, downlink: RateQueue | None = None) -> None:
    """The chunks `spec`'s cut reads (None: every chunk of the model) from `urls` into `store`; SessionError as soon
    as the URLs cannot bring one (the host sends the rest then). `downlink` (EMULATION): the member's emulated
    downlink, which the downloads pass."""
    scheduler = ChunkScheduler()
    async with contextlib.AsyncExitStack() as stack:
        sources: dict[str, ChunkSource] = {}
        for url in urls:
            source = await stack.enter_async_context(UrlSource(url, store.manifest, downlink=downlink))
            sources[source.name] = source
            scheduler.add_source(source.name, Kind.URL)
        if spec is not None:
            await fetch_stage(store, spec, scheduler, sources, tell=tell, patient=False)
        else:
            scheduler.want(store.missing(range(store.manifest.n_chunks)))
            await fetch_chunks(store, scheduler, sources, tell=tell, patient=False)


async def stage_from_urls(store: ChunkStore, spec: StageSpec, urls: Sequence[str], dest: Path,
                          expected: StageManifest, tell: Callable[[str], None] = log.warning,
                          downlink: RateQueue | None = None) -> Path:
    """`spec`'s stage at `dest`, cut from the chunks it needs fetched from `urls` into `store` and checked against
    the host's stage manifest; SessionError as soon as the URLs cannot bring a chunk (the host sends the stage
    then). The cut is written beside `dest` and moved into place whole, so a `dest` present is a checked stage."""
    await fetch_from_urls(store, urls, tell, spec, downlink)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.cut")
    try:
        await run_stoppable(partial(cut_and_check, store, spec, part, expected))
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest

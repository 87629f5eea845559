"""The head: turns chat requests into tokens, sends rows around the ring, closes it, samples, streams text.

Pipelining: several requests are in flight at once, each in its own KV-cache sequence (`seq`,
carried per row in the frame's header), and a long prompt goes round in chunks of at most `n_batch`
rows, the next sent while the previous is still in later stages (every stage computes frames in the
order it receives them, so the chunks enter each KV cache in order). At most `depth` frames are in
the ring at once, one per stage and one on the wire: enough to keep every stage busy, few enough
that a decode step, packed first into the next frame, never queues behind a whole prompt.
While a prompt is prefilled its request gets `progress` events instead of text.

A finished request's sequence keeps its KV cache on every stage (slots.py): the next request takes
the slot whose tokens share the longest prefix with its prompt and prefills only the rest, after a
`trim` message has dropped the slot's other positions on every stage (it travels ahead of the
request's frames, and every link delivers in order). A request that fails has its sequence freed
by a `free` message that travels the whole ring and comes back; only then is that slot reused.

The ring's running figures are kept in ring_stats.py; a reply's text is paced in reply_stream.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kafila.engine.chain import Batch, logit_rows, take_batch
from kafila.engine.chat.formats import CONTENT_ONLY
from kafila.engine.draft import DraftModel
from kafila.engine.embedding import Embedder
from kafila.engine.request import Chunk, Request
from kafila.engine.stage import ContextConfig
from kafila.engine.vocab import Vocab
from kafila.errors import NeighbourFault, NetworkError, SessionEnded
from kafila.planner.ttft import TtftModel, window_depth
from kafila.session.protocol import frames, messages
from kafila.session.protocol.authority import Sender, Via, chat_owner
from kafila.session.protocol.frames import ActivationHeader, Frame, Phase
from kafila.session.ring.chat_request import BadRequest
from kafila.session.ring.frame_check import FrameLimits, from_neighbour, shape_fault
from kafila.session.ring.reply_stream import paced
from kafila.session.ring.request_builder import RequestBuilder
from kafila.session.ring.ring_stats import RingStats
from kafila.session.ring.slots import Slots, sharer
from kafila.session.ring.speculation import RequestDrafter, Speculator
from kafila.session.ring.stage_runtime import StageWorker

log = logging.getLogger("kafila.head")


@dataclass(eq=False)  # a job is itself: compared field by field, two would compare their requests' arrays
class Job:
    """One chat request and the queue its events go to."""

    id: str
    body: Any  # as the client sent it: RequestBuilder.build validates it
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    request: Request | None = None
    started: float = field(default_factory=time.perf_counter)
    token_times: list[float] = field(default_factory=list)  # when each generated token was sampled
    abandoned: bool = False  # its client went away: freed at its next sampled row, not decoded to max_tokens
    owner: str = ""  # the member whose API it came through ("": this one): its slot's cache is reused only by it
    tool_format: str = CONTENT_ONLY  # the dialect its reply's tool calls come in (engine/chat/formats.py)


class Head:
    """The head's serving loop over a ring `order` (head first); a ring of one runs entirely here."""

    def __init__(self, worker: StageWorker, embedder: Embedder, vocab: Vocab, config: ContextConfig, order: list[str],
                 predicted: dict[str, float], send_next: Callable[[bytes], Awaitable[None]] | None,
                 inbox: asyncio.Queue[bytes], trace: Callable[[dict[str, Any]], None] | None = None,
                 ttft: TtftModel | None = None, speculate: str = "off", draft: DraftModel | None = None) -> None:
        self.worker, self.embedder, self.vocab, self.config = worker, embedder, vocab, config
        self.order = order
        self.send_next = send_next  # None for a ring of one
        self.inbox = inbox  # messages coming back from the last member (or from ourselves)
        self.stats = RingStats(predicted)
        self.ttft = ttft  # the plan's TTFT model: the prediction beside each measured first token
        self._slots = Slots.empty(config.n_seq_max)
        self.speculator = Speculator(speculate, self.stats.circuit_costs, lambda: max(len(self._active) - 1, 0),
                                     draft, worker.call)
        self.requests = RequestBuilder(vocab, embedder.n_vocab, config, self.speculator)
        self._waiting: list[Job] = []
        self._active: dict[int, Job] = {}
        # frame id -> (its chunks, rows wanting logits, sent at, (sequences, positions) as sent)
        self._in_flight: dict[int, tuple[list[Chunk], np.ndarray, int, tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        self._freeing: set[int] = set()  # slots whose free is going round the ring
        self._depth = window_depth(len(order))  # frames in the ring at once: one per stage, one on the wire
        self._wake = asyncio.Event()
        self._ids = itertools.count()
        self._frame_ids = itertools.count()
        self._returned_at: int | None = None  # when the last decode frame's own stage call ended (turnaround)
        self.trace = trace  # records every batch and free in the order all stages compute them
        self.failed: str | None = None
        self._tg: asyncio.TaskGroup | None = None
        # chats forwarded before run() started (the host's first can come with the admission): answered once it has
        self._early: list[tuple[messages.Chat, Callable[[bytes], Awaitable[None]], str]] = []
        self._handlers: dict[type[messages.Control], Callable[[Any], Awaitable[None]]] = {
            messages.Free: self._on_free,
            messages.Trim: self._on_trim,
            messages.Fork: self._on_fork,
            messages.Chat: self._on_chat,
            messages.Bye: self._on_bye,
        }

    # -- requests -------------------------------------------------------------------------------
    async def chat(self, body: Any, owner: str = "") -> AsyncGenerator[dict[str, Any], None]:
        """Run one chat request; yields {"delta": text, "tokens": ids}..., then {"done": stats} or {"error": message}.

        While its prompt is prefilled, {"progress": {"prefilled": n, "prompt_tokens": total}} after each chunk.

        An error a lost member caused carries "resumable": the API server then sends the request
        again to the re-planned ring, with the tokens so far as body["resume"].
        """
        if self.failed:
            yield {"error": self.failed}
            return
        job = Job(f"chat-{next(self._ids)}", body, owner=owner)
        try:
            job.request, job.tool_format = self.requests.build(job.body)
        except BadRequest as exc:  # checked again here: the API is not the only way in (DESIGN §5)
            yield exc.event()
            return
        except Exception as exc:  # a bug must cost this request only, not the head and the ring with it
            log.exception("the head could not start a request")
            yield {"error": f"the head failed on this request: {exc}", "status": 500}
            return
        self._waiting.append(job)
        self._wake.set()
        if job.tool_format != CONTENT_ONLY:  # the API reads the reply's calls in this dialect
            yield {"tool_format": job.tool_format}
        try:
            async with contextlib.aclosing(paced(job.events)) as events:
                async for evt in events:
                    yield evt
                    if "done" in evt or "error" in evt:
                        return
        finally:  # the asker stopped reading (a client that disconnected): its slot is wanted by others
            self._abandon(job)

    def _abandon(self, job: Job) -> None:
        if job in self._waiting:
            self._waiting.remove(job)
        elif job in self._active.values():
            job.abandoned = True

    def fail_all(self, reason: str, resumable: bool = False) -> None:
        """End every request with `reason`; new requests are refused the same way."""
        self.failed = reason
        for job in [*self._waiting, *self._active.values()]:
            job.events.put_nowait({"error": reason, "resumable": resumable})
        self._waiting.clear()
        self._active.clear()
        self._in_flight.clear()
        self._wake.set()

    # -- the two loops --------------------------------------------------------------------------
    async def run(self) -> None:
        """Dispatch and collect until cancelled (or until the ring fails)."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for msg, reply, owner in self._early:
                self.serve_remote(msg, reply, owner)
            self._early.clear()
            tg.create_task(self._dispatch_loop())
            tg.create_task(self._collect_loop())

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.failed:
                continue
            for job in list(self._waiting):
                if self._slots and job in self._waiting:  # (one abandoned while an earlier one's trim was sent)
                    await self._start(job)
            await self._dispatch()

    async def _start(self, job: Job) -> None:
        """Give a waiting job a slot, its cached prefix kept (trimmed to it), or a running request's prompt forked
        into it; a job whose prompt a running request is still prefilling waits for it (n choices share one)."""
        r = job.request
        assert r is not None
        src, shared = sharer(r.prompt, job.owner, r.reuse_cache, {s: (j.request.prompt, j.owner, j.request.reuse_cache)
                                                                  for s, j in self._active.items() if j.request})
        shared = shared if shared > self._slots.cached(r.prompt, r.reuse_cache, job.owner) else 0
        source = self._active[src].request if shared else None
        if source is not None and source.fed < shared:
            return  # its rows are on their way round: forked once every stage holds them
        self._waiting.remove(job)
        taken = self._slots.take(r.prompt, r.reuse_cache, job.owner)
        r.seq = taken.slot
        r.reuse(shared or taken.keep)
        self._active[taken.slot] = job
        if shared:
            await self._fork(src, taken.slot, shared)
        elif taken.trim:
            await self._trim(taken.slot, taken.keep)

    async def _dispatch(self) -> None:
        """Send frames, each packing the next chunk of every ready request, while the ring has room."""
        while len(self._in_flight) < self._depth and not self.failed:
            batch = take_batch([job.request for job in self._active.values() if job.request is not None],
                               self.config.n_batch)
            if batch is None:
                return
            await self._send(batch)

    async def _send(self, batch: Batch) -> None:
        rows = batch.rows
        embd = self.embedder.rows(batch.tokens)
        fid = next(self._frame_ids)
        steps = () if rows.step is None else tuple(rows.step.tolist())
        header = ActivationHeader(fid, Phase.DECODE if batch.decode_only else Phase.PREFILL,
                                  tuple(rows.pos.tolist()), embd.shape[0], embd.shape[1], seqs=tuple(rows.seq.tolist()),
                                  steps=steps)
        if self.trace:
            self.trace({"frame": fid, "tokens": batch.tokens.tolist(), "seqs": rows.seq.tolist(),
                        "positions": rows.pos.tolist(), "want": rows.want.tolist(), "steps": list(steps)})
        now = time.perf_counter_ns()
        if self._returned_at is not None and batch.decode_only and not self._in_flight:
            self.stats.turnaround(now - self._returned_at)  # one stream: what the head adds to each circuit
        self._returned_at = None
        self._in_flight[fid] = (list(batch.chunks), rows.want, now, (header.seqs, header.positions))
        msg = frames.encode(Frame(header, embd))
        if self.send_next is None:
            self.inbox.put_nowait(msg)
        else:
            await self.send_next(msg)

    async def _collect_loop(self) -> None:
        while True:
            msg = await self.inbox.get()
            kind = messages.kind(msg)
            if kind == "frame":
                await self._finish_frame(from_neighbour(frames.decode, msg))
            elif kind == "control":
                await self._on_control(from_neighbour(messages.decode, msg))

    async def _finish_frame(self, frame: Frame) -> None:
        arrived = time.perf_counter_ns()
        entry = self._in_flight.pop(frame.header.frame_id, None)
        if entry is None:
            return  # sent before a failure reset the ring: stale
        taken, want, sent, rows = entry
        if (frame.header.seqs, frame.header.positions) != rows:
            raise NeighbourFault(f"frame {frame.header.frame_id} came back with other sequences or positions "
                                 "than the head sent")
        if (why := shape_fault(frame, FrameLimits.of(self.config, self.worker.engine.n_embd))) is not None:
            raise NeighbourFault(why)  # the last stage's rows: its fault, not the head's stage (frame_check.py)
        self._wake.set()  # the ring has room again: the next chunk can go while this frame is computed here
        # an EngineError here is the head's own stage failing on its own rows: the member reports itself lost
        logits, head_ns = await self.worker.run(frame, want)
        if self.trace:
            self.trace({"logits": frame.header.frame_id, "sha256": hashlib.sha256(logits.tobytes()).hexdigest(),
                        "rows": [hashlib.sha256(row.tobytes()).hexdigest() for row in logits]})  # wanted rows, in order
        if frame.header.phase == Phase.DECODE:
            self.stats.add(self.order[1:] + self.order[:1], (*frame.header.stage_times_ns, head_ns),
                           arrived - sent + head_ns, max(frame.header.steps, default=0) + 1)
            self._returned_at = arrived + head_ns
        for chunk, row in logit_rows(taken, logits):
            slot = chunk.seq
            job = self._active.get(slot)
            if job is None or job.request is None:
                continue
            if job.abandoned:
                await self._free(slot)
                continue
            before = len(job.request.generated)
            try:
                piece = job.request.complete(chunk, row)
            except Exception as exc:  # this request's sampling failed: it ends, the ring goes on
                log.exception("the head failed on request %s", job.id)
                job.events.put_nowait({"error": f"the head failed on this request: {exc}", "status": 500})
                await self._free(slot)
                continue
            if job.request.trim_from is not None:  # a draft's rejected rows: gone before its next rows go in
                await self._trim(slot, job.request.trim_from)
                job.request.trimmed()
            new = job.request.generated[before:]
            if new and not job.token_times:
                self._first_token(job)
            for _ in new:
                self.stats.count_token()
                job.token_times.append(time.perf_counter())
            if piece or new:
                evt: dict[str, Any] = {"delta": piece, "tokens": new, **job.request.logprobs_since(before)}
                if new and before == 0 and not job.request.cached:  # what a resumed reply is rebuilt in
                    evt["prompt_cuts"] = list(job.request.cuts)
                job.events.put_nowait(evt)
            elif not chunk.wants_logits:  # a prompt chunk went round: the request shows its progress
                job.events.put_nowait({"progress": {"prefilled": job.request.fed,
                                                    "prompt_tokens": len(job.request.prompt)}})
            if job.request.done:
                await self._finish_job(slot, job)
        self._wake.set()
        # the next frame leaves now rather than a task switch later (the dispatch loop then finds it sent):
        # one stream's every token waits for this turnaround
        await self._dispatch()

    def _first_token(self, job: Job) -> None:
        """Record the request's time to first token (from its arrival here) beside the plan's for its prompt."""
        assert job.request is not None
        fed = max(len(job.request.prompt) - job.request.cached, 1)  # a reused cache's tokens were not prefilled
        # ... but the new rows attend to them
        predicted = self.ttft.predict(fed, job.request.cached) if self.ttft is not None else None
        self.stats.ttft = messages.TtftTime(fed, time.perf_counter() - job.started, predicted)

    async def _finish_job(self, slot: int, job: Job) -> None:
        assert job.request is not None
        times = job.token_times
        elapsed = time.perf_counter() - (times[0] if times else job.started)
        n = len(job.request.generated)
        gaps = np.diff(times)
        # the ring's running figures, then this request's own (its tokens/s, not the ring's)
        done = {**self.stats.as_dict(), "finish_reason": job.request.finish_reason, "completion_tokens": n,
                "prompt_tokens": len(job.request.prompt), "cached_tokens": job.request.cached,
                "tokens_per_s": (n - 1) / elapsed if n > 1 and elapsed > 0 else None,
                "token_interval_median_ms": float(np.median(gaps)) * 1e3 if len(gaps) else None}
        drafter, session = job.request.drafter, self.speculator.as_dict()
        drafts = ({"mode": drafter.mode, "drafted": drafter.drafted, "accepted": drafter.accepted,
                   "drafting_s": drafter.drafting_s}
                  if isinstance(drafter, RequestDrafter) else {"mode": "off", "drafted": 0, "accepted": 0,
                                                               "drafting_s": 0.0})
        # trips round the ring and the compute steps they carried: what a token cost, speculation or not
        done["speculation"] = {**drafts, "circuits": job.request.circuits, "rows": job.request.circuit_rows,
                               **{k: session[k] for k in ("draft_model", "draft_note", "draft_step_s")}}
        job.events.put_nowait({"done": done})
        del self._active[slot]
        self._slots.put(slot, job.request.held, job.owner)  # kept on every stage for its owner's next turn
        self._wake.set()

    async def _free(self, slot: int) -> None:
        """Forget the request in `slot`; its sequence is reused once the free has gone round the ring."""
        del self._active[slot]
        if self.trace:
            self.trace({"free": slot})
        if self.send_next is None:
            await self._release(slot)
        else:
            self._freeing.add(slot)
            await self.send_next(messages.encode(messages.Free(slot)))

    async def _release(self, slot: int) -> None:
        await self.worker.free(slot)
        self._slots.put(slot)
        self._wake.set()

    async def _trim(self, slot: int, keep: int) -> None:
        """Drop `slot`'s positions from `keep` on, on every stage, before a new request's rows go in."""
        if self.trace:
            self.trace({"trim": slot, "keep": keep})
        if self.send_next is None:
            await self.worker.free(slot, keep)
        else:
            await self.send_next(messages.encode(messages.Trim(slot, keep)))

    async def _fork(self, src: int, slot: int, keep: int) -> None:
        """`slot` becomes a copy of `src`'s first `keep` positions on every stage, ahead of the slot's rows."""
        if self.trace:
            self.trace({"fork": slot, "src": src, "keep": keep})
        if self.send_next is None:
            await self.worker.fork(src, slot, keep)
        else:
            await self.send_next(messages.encode(messages.Fork(src, slot, keep)))

    async def _on_control(self, msg: messages.Control) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("head ignored a %r message from the ring", msg.T)
            return
        await handler(msg)

    async def _on_bye(self, msg: messages.Bye) -> None:
        raise SessionEnded(msg.reason)  # a neighbour ended the session: so does this ring (member.py)

    async def _on_free(self, msg: messages.Free) -> None:
        if msg.seq not in self._freeing:  # a slot added twice would be handed to two requests at once
            raise NeighbourFault(f"a free of slot {msg.seq} came round, which the head did not free")
        self._freeing.discard(msg.seq)
        await self._release(msg.seq)

    async def _on_trim(self, msg: messages.Trim) -> None:
        if not 0 <= msg.seq < self.config.n_seq_max:
            raise NeighbourFault(f"a trim of slot {msg.seq} came round, outside the {self.config.n_seq_max} slots")
        await self.worker.free(msg.seq, msg.keep)  # back from the ring: the head's own stage last

    async def _on_fork(self, msg: messages.Fork) -> None:
        if not (0 <= msg.src < self.config.n_seq_max and 0 <= msg.seq < self.config.n_seq_max):
            raise NeighbourFault(f"a fork of slot {msg.src} into {msg.seq} came round, outside the "
                                 f"{self.config.n_seq_max} slots")
        await self.worker.fork(msg.src, msg.seq, msg.keep)  # back from the ring: the head's own stage last

    async def _on_chat(self, msg: messages.Chat) -> None:
        if self.send_next is not None:
            self.serve_remote(msg, self.send_next, chat_owner(Sender(self.order[-1], Via.RING), msg))

    def serve_remote(self, msg: messages.Chat, reply: Callable[[bytes], Awaitable[None]], owner: str) -> None:
        """Answer a forwarded chat, its events back through `reply`; `owner` (its link's) picks the cache it reuses."""

        async def answer() -> None:
            async with contextlib.aclosing(self._guarded(msg.body, owner)) as events:
                try:
                    async for evt in events:
                        await reply(messages.encode(messages.ChatEvt(msg.id, msg.origin, evt)))
                except NetworkError as exc:  # the asker is gone (a host that left, say): not the ring's failure
                    log.info("chat %s from %s: its answer cannot be sent (%s)", msg.id, msg.origin, exc)

        if self._tg is None:
            self._early.append((msg, reply, owner))
            return
        self._tg.create_task(answer())

    async def _guarded(self, body: Any, owner: str) -> AsyncGenerator[dict[str, Any], None]:
        """`chat`'s events; a failure on one request ends that request with an error, never the head."""
        try:
            async with contextlib.aclosing(self.chat(body, owner)) as events:
                async for evt in events:
                    yield evt
        except Exception as exc:
            log.exception("the head failed on one request")
            yield {"error": f"the head failed on this request: {exc}", "status": 500}


def trace_writer(path: Path | None, order: list[str]) -> Callable[[dict[str, Any]], None] | None:
    """Appends the head's batches as JSON lines to `path` (tests replay them on one context); None: no trace."""
    if path is None:
        return None

    def write(entry: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    write({"ring": order})  # a new ring (a re-plan's too): every stage's cache is empty
    return write

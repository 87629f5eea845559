"""A member serving in an admitted ring: the head batches and samples, any other stage computes and passes
activations on; a ring edge that fails is reported to the coordinator, and a neighbour's goodbye passed on.
A part of the member (runtime.py composes it): it owns the stage worker, the edges and the head or forwarder.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from kafila.engine.draft import DraftModel
from kafila.engine.embedding import Embedder
from kafila.engine.stage import ContextConfig
from kafila.engine.vocab import Vocab
from kafila.errors import (
    EngineError,
    KafilaError,
    NeighbourFault,
    NetworkError,
    PlanInputError,
    ProtocolError,
    SessionEnded,
    SessionError,
)
from kafila.model.gguf_file import GGUFFile
from kafila.net.endpoint import RingEdges
from kafila.planner.ttft import TtftModel, plan_model
from kafila.session.api.server import ApiServer, Forwarder, ModelContext
from kafila.session.member.machine import log
from kafila.session.member.stage import stage_config
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, Via, chat_owner
from kafila.session.ring.frame_check import FrameLimits
from kafila.session.ring.head import Head, trace_writer
from kafila.session.ring.ring_stats import show_stats
from kafila.session.ring.speculation import load_draft
from kafila.session.ring.stage_runtime import StageWorker, pump, relay
from kafila.session.state import SessionState


def _first(group: BaseException) -> BaseException:
    """The first exception in a (nested) exception group."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


class RingService:
    """The member's ring while it serves, and its stop: `assigned` is the ring, `worker` its loaded stage, `edges`
    its two ring edges (set as each is ready); `send_host` reaches the coordinator."""

    def __init__(self, opts: MemberOptions, state: SessionState, api: ApiServer | None,
                 send_host: Callable[[messages.Control], Awaitable[None]]) -> None:
        self.opts, self.state, self.api, self.send_host = opts, state, api, send_host
        self.assigned: messages.Assign | None = None
        self.worker: StageWorker | None = None
        self.edges: RingEdges | None = None
        self.draft: DraftModel | None = None  # as the head: the draft model that drafts for speculation
        self.head: Head | None = None
        self.forwarder: Forwarder | None = None
        self.ended: str | None = None  # why the session cannot go on, as a ring neighbour said it
        self.task: asyncio.Task[None] | None = None
        self.up = asyncio.Event()  # serve() has made this epoch's head or forwarder
        # read from the loaded stage file by prepare(): the context /v1/models reports; as the head, the chat
        # template and the embeddings
        self.context: ModelContext | None = None
        self.template: str | None = None
        self.embedder: Embedder | None = None

    @property
    def serving(self) -> bool:
        return self.task is not None and not self.task.done()

    async def prepare(self) -> None:
        """Read what serving needs from the loaded stage file, on worker threads, before the ring is admitted: a
        parse takes ~0.4 s of a loaded machine, which on the loop would hold the links' packets (past their idle
        timeout a neighbour is lost), and after the admission would leave a first request finding no ring."""
        assert self.worker is not None
        path, settings = self.worker.engine.path, self._assigned.settings
        config = stage_config(self._assigned, self.opts.threads)
        meta = await asyncio.to_thread(GGUFFile, path)
        self.context = ModelContext.of(config, meta)
        if self._assigned.head == self.opts.name:
            self.template = settings.chat_template or meta.get("tokenizer.chat_template")  # the host's option first
            self.embedder = await asyncio.to_thread(Embedder, path)

    def start(self, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self.up.clear()
        self.task = spawn(self.serve())

    async def chat(self, msg: messages.Chat, control_name: str, post: Callable[[bytes], None],
                   send: Callable[[bytes], Awaitable[None]]) -> None:
        """A request of the coordinator's API (`control_name`'s link): to the head, or answered that it cannot be.

        The host sends its first chat as soon as it has admitted the ring: it can be read in the same turn as the
        admission, before the serving task that makes the head has run. Dropped, it would wait forever."""
        task = self.task
        if self.head is None and task is not None and not task.done() and not self.up.is_set():
            up = asyncio.ensure_future(self.up.wait())
            try:
                await asyncio.wait({up, task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
        if self.head is not None:
            owner = chat_owner(Sender(control_name, Via.COORDINATOR), msg)  # never its declared origin
            self.head.serve_remote(msg, send, owner)
            return
        # not serving: a loss ended this ring, and the API server sends the request again to the next one
        down = self.task is None or self.task.done()
        why = "its ring is not serving" if down else "it is not the ring's head"
        log.warning("chat %s from %s reached %s, but %s", msg.id, msg.origin, self.opts.name, why)
        with contextlib.suppress(KafilaError):
            post(messages.encode(messages.ChatEvt(msg.id, msg.origin, {
                "error": f"the chat reached {self.opts.name}, but {why}", "resumable": down})))

    @property
    def _assigned(self) -> messages.Assign:
        if self.assigned is None:
            raise ProtocolError("the host sent a ring instruction before assigning a stage")
        return self.assigned

    async def serve(self) -> None:
        assert self.worker is not None and self.edges is not None
        order = list(self._assigned.order)
        is_head = self._assigned.head == self.opts.name
        config = stage_config(self._assigned, self.opts.threads)
        inbox: asyncio.Queue[bytes] = asyncio.Queue()
        try:
            async with asyncio.TaskGroup() as tg:
                if self.edges.prev is not None:
                    self.edges.prev.ack_every_second()
                    tg.create_task(pump(self.edges.prev, inbox, RingView(tuple(order), me=self.opts.name)))
                if self.api:
                    self.api.context = self.context
                if is_head:
                    assert self.embedder is not None
                    vocab = Vocab(self.worker.engine.vocab, self.template)
                    nxt = self.edges.next
                    draft, note = await self._draft_model(vocab, config)
                    trace = trace_writer(self.opts.trace_path, order)
                    self.head = Head(self.worker, self.embedder, vocab, config, order, self._assigned.stage_seconds,
                                     nxt.send if nxt is not None else None, inbox, trace, self._ttft_model(),
                                     self._assigned.settings.speculate, draft)
                    self.head.speculator.model_note = note
                    if self.api:
                        self.api.chat = self.head.chat
                    tg.create_task(self.head.run())
                    tg.create_task(self._report_stats())
                else:
                    assert self.edges.next is not None
                    self.forwarder = Forwarder(self.opts.name, self.edges.next.send)
                    if self.api:
                        self.api.chat = self.forwarder.chat
                    limits = FrameLimits.of(config, self.worker.engine.n_embd)
                    tg.create_task(relay(self.worker, inbox, self.edges.next, limits, self.forwarder.deliver))
                self.up.set()
                self.state.update_member(self.opts.name, status="serving")
        except* SessionEnded as group:  # a neighbour ended the session; pass the word on around the ring
            why = str(_first(group))
            self.ended = why
            self.state.lost = why
            self.fail_requests(why, resumable=False)
            self.say_bye_on_ring(why)
        except* EngineError as group:  # this member's own stage failed on valid input: it leaves, the ring re-plans
            reason = f"its stage failed: {_first(group)}"
            self.state.set_phase("lost", f"{self.opts.name}'s {reason}")
            self.fail_requests(f"member {self.opts.name} was lost: {reason}", lost=self.opts.name)
            with contextlib.suppress(KafilaError):
                await self.send_host(messages.Lost(self.opts.name, reason, self._assigned.epoch))
            raise SessionError(f"{self.opts.name} left the session: {reason}") from None
        except* (NetworkError, ProtocolError) as group:
            reason = "; ".join(str(e) for e in group.exceptions)
            prev = self.edges.prev if self.edges is not None else None
            fault = group.subgroup(NeighbourFault) is not None  # that neighbour's input: it is the one lost
            peer = prev.peer.name if fault and prev is not None else self._failed_peer()
            self.state.lost = f"{peer} lost: {reason}"
            self.state.set_phase("lost", f"ring edge failed ({peer}): {reason}")
            self.fail_requests(f"member {peer} was lost: {reason}", lost=peer)
            with contextlib.suppress(KafilaError):
                await self.send_host(messages.Lost(peer, reason, self._assigned.epoch))

    def say_bye_on_ring(self, why: str) -> None:
        """Tell the next member along the ring that the session cannot go on, and why (it tells the next)."""
        nxt = self.edges.next if self.edges is not None else None
        if nxt is not None:
            with contextlib.suppress(KafilaError):
                nxt.post(messages.encode(messages.Bye(why)))

    def _failed_peer(self) -> str:
        for link in (self.edges.prev, self.edges.next) if self.edges else ():
            if link is not None and link.closed is not None:
                return link.peer.name
        return "a ring neighbour"

    def fail_requests(self, reason: str, lost: str | None = None, resumable: bool = True) -> None:
        # resumable: the API servers send them again once the host has planned a ring without the lost member
        if self.head is not None:
            self.head.fail_all(reason, resumable=resumable)
        if self.forwarder is not None:  # the API server does not re-send what the lost head held
            self.forwarder.fail_all(reason, lost=lost, resumable=resumable)
        if self.api:
            self.api.chat = None

    async def _draft_model(self, vocab: Vocab, config: ContextConfig) -> tuple[DraftModel | None, str | None]:
        """This machine's draft model for the head, and a note when it was asked for and cannot be used."""
        if self.opts.draft is None or self.worker is None:
            return None, None
        self.draft, note = await asyncio.to_thread(load_draft, self.opts.draft, config, vocab, self.worker.engine.path,
                                                   self._assigned.model)
        self.state.log(note)
        return self.draft, None if self.draft else note

    def _ttft_model(self) -> TtftModel | None:
        """The plan's TTFT model (None when it predicts none, or a host of another version sent a malformed one)."""
        try:
            return plan_model(self._assigned.plan)
        except PlanInputError as exc:
            log.warning("the plan's TTFT model is unusable: %s", exc)
            return None

    async def _report_stats(self) -> None:
        assert self.head is not None
        while True:
            await asyncio.sleep(1.0)
            stats = self.head.stats.message()
            show_stats(self.state, stats)
            # the coordinator may be gone: the ring serves on without it (see run), and reports to its successor
            with contextlib.suppress(NetworkError):
                await self.send_host(stats)

    async def stop(self, reason: str | None, lost: str | None = None) -> None:
        # `lost`: the member whose loss stops the ring, named to the API servers (a request that two lost
        # heads were serving is not sent to a third: it may be what killed them)
        if reason:
            self.fail_requests(reason, lost=lost)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, KafilaError):
                await self.task
            self.task = None
        if self.edges is not None:
            for link in (self.edges.next, self.edges.prev):
                if link is not None:
                    await link.close()
            self.edges = None
        if self.worker is not None:
            await asyncio.to_thread(self.worker.close)
            self.worker = None
        if self.draft is not None:  # after its stage's thread, which ran its calls, has stopped
            self.draft.close()
            self.draft = None
        self.head = self.forwarder = None
        self.context = self.template = self.embedder = None


"""A member: measure, announce, connect to the host, take a stage, open the ring edges, serve.

One code path whether the member is the head or not, and whether the ring runs on one machine
or across the world: only the links differ.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from kafila.engine.embedding import Embedder
from kafila.engine.stage import ContextConfig, StageEngine
from kafila.engine.vocab import Vocab
from kafila.errors import (
    DiskFullError,
    EngineError,
    KafilaError,
    NetworkError,
    PlanInputError,
    ProtocolError,
    SessionEnded,
    SessionError,
)
from kafila.model.cut import StageSpec
from kafila.model.embedded import default_model_path, resolve_model
from kafila.model.gguf_file import GGUFFile
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint, RingEdges
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.planner.ttft import TtftModel, plan_model
from kafila.session.api.server import ApiServer, Forwarder
from kafila.session.control.heartbeat import working
from kafila.session.control.measure import Emulation, cached_probe, measurements
from kafila.session.control.takeover import FIND_COORDINATOR_S, coordinate, successor, survivors
from kafila.session.delivery.cache_inventory import InUse, start_cache_use
from kafila.session.delivery.local_model import cut_locally, model_claim
from kafila.session.delivery.stage_files import StageReceiver
from kafila.session.delivery.transfer import Superseded, receive_stage
from kafila.session.options import MemberOptions
from kafila.session.protocol import frames, messages
from kafila.session.protocol.manifest import StageManifest
from kafila.session.ring.compute_turn import ComputeTurn
from kafila.session.ring.head import Head
from kafila.session.ring.stage_runtime import StageWorker
from kafila.session.state import SessionState, StageStats, member_view
from kafila.session.stoppable import run_stoppable

log = logging.getLogger("kafila.member")
RECV_TIMEOUT_S = 60.0
END_GRACE_S = 1.0  # a session that cannot go on: how long clients get to read why before this process ends


async def find_host(ep: PeerEndpoint, timeout_s: float, gone: frozenset[bytes] = frozenset(),
                    name: str | None = None) -> VerifiedMember:
    """The session's host (its coordinator) among the verified members.

    The rendezvous answers requests and never pushes, so the member list is asked for again (backing
    off to once a second) until the host is on it. The host announces itself before its join code
    exists, so the first answer almost always has it. After a takeover: the coordinator named `name`,
    never one of the `gone` (a lost coordinator stays listed until the rendezvous drops it as silent).
    """
    delay = 0.05
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                for vm in (await ep.members()).verified:
                    if (vm.measurements.get("role") == "host" and vm.member_id not in gone
                            and name in (None, vm.name)):
                        return vm
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
    except TimeoutError:
        raise SessionError(f"the session's host did not appear within {timeout_s:.0f} s (has it ended?)") from None


async def connect_host(ep: PeerEndpoint, timeout_s: float) -> Link:
    """A link to the session's coordinator; one that does not answer is passed over for another.

    A host killed stays listed at the rendezvous until it drops it as silent, beside the member that
    took coordination over: a member joining then (a restarted host's machine, say) may find it first.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    gone: set[bytes] = set()
    failed: NetworkError | None = None
    while True:
        try:
            host = await find_host(ep, max(0.0, deadline - loop.time()), frozenset(gone))
        except SessionError:
            if failed is not None:  # the one coordinator listed does not answer: say so, not that none is listed
                raise failed from None
            raise
        try:
            return await ep.connect(host)
        except NetworkError as exc:
            log.info("the coordinator %s does not answer (%s); looking for another", host.name, exc)
            gone.add(host.member_id)
            failed = exc


def _first(group: BaseException) -> BaseException:
    """The first exception in a (nested) exception group."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def pump(link: Link, inbox: asyncio.Queue[bytes]) -> None:
    """Move every message arriving on `link` into `inbox` until the link fails."""
    while True:
        inbox.put_nowait(await link.recv())


class MemberRuntime:
    """Everything a member does after it is connected to the host."""

    def __init__(self, ep: PeerEndpoint, control: Link, state: SessionState, opts: MemberOptions,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None) -> None:
        self.ep, self.control, self.state, self.opts, self.cache, self.api = ep, control, state, opts, cache, api
        self.use = use  # the delivered stage this member serves: `kafila cache --prune` leaves it
        self.worker: StageWorker | None = None
        self.head: Head | None = None
        self.forwarder: Forwarder | None = None
        self.edges: RingEdges | None = None
        self.assignment: messages.Assign | None = None
        self.roster: messages.Roster | None = None  # the coordinator's replicated state
        self._serving: asyncio.Task[None] | None = None
        self._ring_up = asyncio.Event()  # _serve has made this epoch's head or forwarder
        self._pending: list[messages.Control] = []
        self._ended: str | None = None  # why the session cannot go on, as a ring neighbour said it
        self._gone: set[bytes] = set()  # coordinators lost so far (their endpoints' member ids)
        self._heirs: set[str] = set()  # members that took coordination over, so that a failed takeover is not retried
        self._coordinating: asyncio.Task[None] | None = None  # this process coordinates the session (a takeover)
        # what each of the host's messages does; a handler returns an exit status to end the session
        self._handlers: dict[type[messages.Control], Callable[[Any], Awaitable[int | None]]] = {
            messages.Assign: self._on_assign,
            messages.Connect: self._on_connect,
            messages.Admit: self._on_admit,
            messages.Reject: self._on_reject,
            messages.Refused: self._on_reject,
            messages.Lost: self._on_lost,
            messages.Chat: self._on_chat,
            messages.Bye: self._on_bye,
            messages.Roster: self._on_roster,
        }

    @property
    def _assigned(self) -> messages.Assign:
        if self.assignment is None:
            raise ProtocolError("the host sent a ring instruction before assigning a stage")
        return self.assignment

    def _config(self) -> ContextConfig:
        """The host's context settings for every stage, with this machine's own thread count."""
        c = self._assigned.config  # validated: exactly the CONFIG_KEYS, each a positive int
        return ContextConfig(n_ctx_per_seq=c["n_ctx_per_seq"], n_seq_max=c["n_seq_max"], n_batch=c["n_batch"],
                             n_threads=self.opts.threads)

    async def send_host(self, msg: messages.Control) -> None:
        await self.control.send(messages.encode(msg))

    async def _next_control(self) -> messages.Control:
        if self._pending:
            return self._pending.pop(0)
        while True:
            raw = await self.control.recv()
            if messages.kind(raw) == "control":
                return messages.decode(raw)
            log.warning("ignored a stray %s message from the host", messages.kind(raw))

    async def run(self) -> int:
        """Follow the host's instructions until it says bye; returns the exit status."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                while True:
                    try:
                        msg = await self._next_control()
                    except NetworkError as exc:  # the host is gone: the ring may well serve on without it
                        status = await self._without_coordinator(str(exc))
                        if status is not None:
                            return status
                        continue  # connected to the member that coordinates now
                    handler = self._handlers.get(type(msg))
                    if handler is None:
                        log.warning("ignored a %r message from the host", msg.T)
                        continue
                    status = await handler(msg)
                    if status is not None:
                        return status
            finally:
                await self._stop_serving("this member is leaving")
                if self._coordinating is not None:  # the coordinator lives and ends with this process's member
                    self._coordinating.cancel()

    # -- the host's messages (one handler per type) ---------------------------------------------
    async def _on_assign(self, msg: messages.Assign) -> None:
        await self._stop_serving(None)
        await self._setup(msg)

    async def _on_connect(self, msg: messages.Connect) -> None:
        await self._connect()

    async def _on_admit(self, msg: messages.Admit) -> None:
        self._ring_up.clear()
        self._serving = self._tg.create_task(self._serve())
        self.state.lost = None  # an earlier loss is behind us: this ring serves
        self.state.set_phase("admitted", "admitted: serving")

    async def _on_reject(self, msg: messages.Reject | messages.Refused) -> None:
        self.state.rejection = msg.reason
        self.state.set_phase("rejected", f"{msg.T}: {msg.reason}")
        raise SessionError(f"the session was {'rejected' if msg.T == 'reject' else 'refused'}: {msg.reason}")

    async def _on_lost(self, msg: messages.Lost) -> None:
        await self._stop_serving(f"member {msg.who} was lost: {msg.reason}")

    async def _on_chat(self, msg: messages.Chat) -> None:
        # The host sends its first chat as soon as it has admitted the ring: it can be read in the same
        # turn as the admission, before the serving task that makes the head has run. Dropped, its
        # request would wait for an answer forever.
        serving = self._serving
        if self.head is None and serving is not None and not serving.done() and not self._ring_up.is_set():
            up = asyncio.ensure_future(self._ring_up.wait())
            try:
                await asyncio.wait({up, serving}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
        if self.head is not None:
            self.head.serve_remote(msg, self.control.send)
            return
        # not serving: a loss ended this ring, and the API server sends the request again to the next one
        down = self._serving is None or self._serving.done()
        why = "its ring is not serving" if down else "it is not the ring's head"
        log.warning("chat %s from %s reached %s, but %s", msg.id, msg.origin, self.opts.name, why)
        with contextlib.suppress(KafilaError):
            self.control.post(messages.encode(messages.ChatEvt(msg.id, msg.origin, {
                "error": f"the chat reached {self.opts.name}, but {why}", "resumable": down})))

    async def _on_roster(self, msg: messages.Roster) -> None:
        """The coordinator's state: kept, so that this member knows the ring without its host."""
        self.roster = msg
        self.state.coordinator = self.state.coordinator or msg.coordinator
        for name, m in msg.members.items():
            self.state.update_member(name, bandwidth_bytes_per_s=m.bw, dispatch_s=m.disp, memory_bytes=m.mem,
                                     nat=m.nat, rtt_ms=m.rtt_ms)

    async def _on_bye(self, msg: messages.Bye) -> int:
        self.state.set_phase("closed", f"the host closed the session: {msg.reason}")
        return 0

    # -- the host gone ---------------------------------------------------------------------------
    async def _without_coordinator(self, reason: str) -> int | None:
        """Go on after the coordinator left: None once connected to a member that took coordination over.

        Every member makes the same choice from the same replicated roster and assignment: the first
        survivor in ring order holding the model coordinates now (kafila.session.control.takeover). When the
        coordinator's process held a stage, that member re-plans over the survivors; when it held none
        and the ring still serves, it takes the ring over as it is, so that it can re-plan after a later
        loss. With no survivor holding the model the ring serves on under the head until a later loss
        ends the session with that reason (re-planning needs the model's bytes), on every member.
        """
        left = f"the coordinator ({self.state.coordinator or 'the host'}) left the session: {reason}"
        self.state.coordinator_left = left
        roster, assignment = self.roster, self.assignment
        serving = self._serving is not None and not self._serving.done()
        if roster is not None and assignment is not None and self._ended is None:
            heir = successor(roster, assignment.order)
            if heir is not None and heir not in self._heirs:
                if roster.beside in assignment.order:  # the ring lost a stage with its coordinator
                    await self._take_over(heir, left)
                    return None
                if serving:  # a coordinate-only host: the ring is whole
                    await self._hand_over(heir, left)
                    return None
        if self.assignment is not None and self._serving is not None and not self._serving.done():
            self.state.coordinator = self.assignment.head
            self.state.log(f"{left}; the ring serves on, and {self.assignment.head} (the head) coordinates now")
            await asyncio.wait({self._serving})  # until the ring itself breaks (our own cancellation still ends us)
            why = f"{self.state.lost or 'the ring broke'}, after {left}"
        elif self.state.lost is not None:
            why = f"{self.state.lost}, and {left}"
        else:
            why = f"{left} before the ring was admitted"
        if self._ended is not None:
            why = self._ended  # the first member to end said why; every member says the same
        elif self.assignment is not None:
            why += ("; the ring cannot be re-planned without its host: no survivor holds the model to cut new "
                    "stages from (a member joined with `kafila join CODE --model PATH` would have taken "
                    "coordination over): open a new session with `kafila host`")
        self.state.lost = why
        self.state.set_phase("closed", f"the session cannot go on: {why}")
        self._fail_requests(why, resumable=False)
        self._say_bye_on_ring(why)
        await asyncio.sleep(END_GRACE_S)  # let every client waiting on this process read the reason
        raise SessionError(why)

    async def _take_over(self, heir: str, left: str) -> None:
        """Stop serving the broken ring and connect to `heir`, which coordinates now (this member, maybe)."""
        assert self.roster is not None and self.assignment is not None
        doing = "this member takes" if heir == self.opts.name else f"{heir} takes"
        self.state.coordinator = heir
        self.state.set_phase("lost", f"{left}; {doing} coordination over (it holds the model) and re-plans "
                                     f"over {', '.join(survivors(self.roster, self.assignment.order))}")
        await self._stop_serving(f"{left}; re-planning over the survivors")  # resumable: the API servers wait
        await self._follow(heir, adopt=False)

    async def _hand_over(self, heir: str, left: str) -> None:
        """Serve on, and report from now on to `heir` (this member, maybe), which takes the ring over as it is."""
        assert self.roster is not None and self.assignment is not None
        doing = "this member takes" if heir == self.opts.name else f"{heir} takes"
        self.state.coordinator = heir
        self.state.log(f"{left}; the ring serves on, and {doing} coordination over (it holds the model, "
                       f"so it can re-plan after a later loss)")
        await self._follow(heir, adopt=True)

    async def _follow(self, heir: str, adopt: bool) -> None:
        """Leave the lost coordinator for `heir`; start coordinating first when `heir` is this member."""
        assert self.roster is not None and self.assignment is not None
        self._heirs.add(heir)
        self._gone.add(self.control.peer.member_id)
        with contextlib.suppress(KafilaError):
            await self.control.close()
        if heir == self.opts.name:
            self._coordinating = self._tg.create_task(self._coordinate(self.assignment, self.roster, adopt))
        found = await find_host(self.ep, FIND_COORDINATOR_S, frozenset(self._gone), heir)
        self.control = await self.ep.connect(found)
        self._pending.clear()  # the lost coordinator's instructions are void
        self.state.log(f"connected to {heir}, which coordinates now")

    async def _coordinate(self, assign: messages.Assign, roster: messages.Roster, adopt: bool) -> None:
        """This process coordinates the session now; its failure is the members' loss of a coordinator, not ours."""
        try:
            status = await coordinate(self.opts, assign, roster, self.state, self.cache, self.use, adopt)
            self.state.log(f"coordination ended (status {status})")
        except KafilaError as exc:
            self.state.log(f"coordination failed: {exc}")

    # -- setting up an epoch --------------------------------------------------------------------
    async def _setup(self, msg: messages.Assign) -> None:
        self.assignment = msg
        me = self.opts.name
        if me not in msg.ranges:
            raise ProtocolError(f"the host's assignment has no block range for this member ({me})")
        self.state.plan = msg.plan
        self.state.model = msg.model
        self.state.stages = {n: StageStats(s) for n, s in msg.stage_seconds.items()}
        start, end = msg.ranges[me]
        is_head = msg.head == me
        self.state.set_phase("delivering", f"assigned blocks [{start}, {end}){' as the head' if is_head else ''}")
        try:
            path = await (self._cut_stage(msg, StageSpec(start, end, head=is_head)) if msg.cut_local
                          else self._receive_stage(msg.stage))
        except Superseded:  # the host gave this epoch up (a member lost, a newer plan) before the stage came
            self.state.log(f"epoch {msg.epoch}'s stage is no longer wanted: the host planned again")
            return
        except DiskFullError as exc:  # the host plans again without this member
            with contextlib.suppress(KafilaError):
                await self.send_host(messages.Lost(me, str(exc), msg.epoch))
            raise SessionError(f"{me} left the session: {exc}") from None
        if self.use is not None:
            self.use.add(path)
        config = self._config()
        self.state.update_member(me, status="loading")
        try:
            async with working(self.send_host, msg.epoch, "loading its stage"):
                # stoppable: a SIGTERM while llama.cpp loads a big stage stops the load, not waits for it
                engine = await run_stoppable(lambda progress: StageEngine(path, config, is_head, progress))
        except EngineError as exc:  # e.g. another build that does not know the model's architecture
            reason = f"its llama.cpp build cannot load this model's stage: {exc}"
            with contextlib.suppress(KafilaError):
                await self.send_host(messages.Lost(me, reason, msg.epoch))
            raise SessionError(f"{me} left the session: {reason}") from None
        self.worker = StageWorker(engine, self.opts.throttle, ComputeTurn(self.cache.root))
        await self.send_host(messages.Loaded(msg.epoch))
        self.state.update_member(me, status="loaded")

    async def _connect(self) -> None:
        """Open this member's two ring edges (when the host says every stage is loaded)."""
        order = self._assigned.order
        self.state.set_phase("connecting", "opening ring edges")
        async with working(self.send_host, self._assigned.epoch, "opening its ring edges"):
            await self._open_edges(order)

    async def _open_edges(self, order: tuple[str, ...]) -> None:
        # members only: a host's coordinating endpoint may share its machine's name with the member beside it
        by_name: dict[str, VerifiedMember] = {}
        for vm in (await self.ep.members()).verified:
            # a member restarted (a host's machine rejoining) is listed beside its dead self until the
            # rendezvous drops that as silent: the newest announcement is the one alive
            if vm.measurements.get("role") != "host" and (
                    vm.name not in by_name or vm.issued_at > by_name[vm.name].issued_at):
                by_name[vm.name] = vm
        missing = [n for n in order if n not in by_name]
        if missing:
            raise SessionError(f"ring members {missing} are not in the verified member list")
        me = order.index(self.opts.name)
        succ, pred = order[(me + 1) % len(order)], order[me - 1]
        try:
            self.edges = await self.ep.open_ring([by_name[n] for n in order])
        except KafilaError as exc:  # a neighbour gone before admission: the host's to handle, not an exit
            await self._report_edge_failure(pred, str(exc))
            return
        r = self.edges.report
        if len(order) > 1 and self.edges.next is None:
            await self._report_edge_failure(succ, r.error if r is not None and r.error else "no link")
            return
        edge = None
        if self.edges.report is not None:
            r = self.edges.report
            edge = messages.EdgeOutcome(r.predicted, r.actual, r.ready_ms, r.error)
        await self.send_host(messages.Ready(self._assigned.epoch, edge))
        self.state.update_member(self.opts.name, status="ready")

    async def _cut_stage(self, msg: messages.Assign, spec: StageSpec) -> Path:
        """This member's stage cut from its own copy of the model (the host checked the whole file's sha256)."""
        if self.opts.model is None:
            raise ProtocolError("the host asked this member to cut its stage, but it was given no --model")
        self.state.log(f"cutting blocks [{spec.start}, {spec.end}) from {self.opts.model}")
        async with working(self.send_host, msg.epoch, "cutting its stage"):
            path = await asyncio.to_thread(cut_locally, self.cache, self.opts.model, spec, msg.stage)
        await self.send_host(messages.Need(msg.epoch, ()))  # nothing to send: the host counts 0 bytes
        self.state.delivery[self.opts.name] = (msg.stage.size, msg.stage.size)
        self.state.log(f"stage {msg.stage.sha256[:12]} cut locally and verified ({msg.stage.size / 1e6:.1f} MB)")
        return path

    async def _report_edge_failure(self, peer: str, reason: str) -> None:
        """Tell the host that a ring edge to `peer` could not open; it plans again (or ends the session)."""
        if self.edges is not None:
            for link in (self.edges.next, self.edges.prev):
                if link is not None:
                    await link.close()
            self.edges = None
        self.state.log(f"ring edge to {peer} failed: {reason}; waiting for the host")
        await self.send_host(messages.Lost(peer, f"its ring edge could not open: {reason}", self._assigned.epoch))

    async def _receive_stage(self, manifest: StageManifest) -> Path:
        """The stage file, received and verified; raises Superseded when the host gives the epoch up meanwhile."""
        me = self.opts.name
        receiver = StageReceiver(self.cache.root / "delivered", manifest)
        missing = await asyncio.to_thread(receiver.missing)
        receiver.check_space()  # before asking for anything: a full disk is said at once, not after minutes
        await self.send_host(messages.Need(self._assigned.epoch, tuple(missing)))
        total = manifest.size
        self.state.delivery[me] = (total - receiver.bytes_missing, total)
        self.state.changed()

        def progress(have: int) -> None:
            self.state.delivery[me] = (min(have * manifest.chunk_size, total), total)
            self.state.changed()

        def aside(raw: bytes) -> None:
            msg = messages.decode(raw)
            self._pending.append(msg)  # handled after the transfer, or at once: the host gave this epoch up
            if isinstance(msg, messages.Lost | messages.Assign | messages.Reject | messages.Bye):
                raise Superseded(type(msg).__name__)

        seen = len(receiver.have)

        def step() -> str | None:
            # the host sees bytes leave it, not arrive here (a link's windows hold many MB): say when they
            # do; once all are here, verifying the whole file is work it cannot see at all
            nonlocal seen
            if receiver.complete:
                return "verifying its stage"
            moved, seen = len(receiver.have) != seen, len(receiver.have)
            return "receiving its stage" if moved else None

        async with working(self.send_host, self._assigned.epoch, step):
            path = await receive_stage(self.control, receiver, RECV_TIMEOUT_S, aside, progress)
        self.state.delivery[me] = (total, total)
        self.state.log(f"stage {manifest.sha256[:12]} verified ({total / 1e6:.1f} MB)")
        return path

    # -- serving --------------------------------------------------------------------------------
    async def _serve(self) -> None:
        assert self.worker is not None and self.edges is not None
        order = list(self._assigned.order)
        is_head = self._assigned.head == self.opts.name
        config = self._config()
        inbox: asyncio.Queue[bytes] = asyncio.Queue()
        try:
            async with asyncio.TaskGroup() as tg:
                if self.edges.prev is not None:
                    tg.create_task(pump(self.edges.prev, inbox))
                if is_head:
                    path = self.worker.engine.path
                    vocab = Vocab(self.worker.engine.vocab, GGUFFile(path).get("tokenizer.chat_template"))
                    nxt = self.edges.next
                    self.head = Head(self.worker, Embedder(path), vocab, config, order, self._assigned.stage_seconds,
                                     nxt.send if nxt is not None else None, inbox, self._trace_writer(),
                                     self._ttft_model())
                    if self.api:
                        self.api.chat = self.head.chat
                    tg.create_task(self.head.run())
                    tg.create_task(self._report_stats())
                else:
                    assert self.edges.next is not None
                    self.forwarder = Forwarder(self.opts.name, self.edges.next.send)
                    if self.api:
                        self.api.chat = self.forwarder.chat
                    tg.create_task(self._stage_loop(inbox))
                self._ring_up.set()
                self.state.update_member(self.opts.name, status="serving")
        except* SessionEnded as group:  # a neighbour ended the session; pass the word on around the ring
            why = str(_first(group))
            self._ended = why
            self.state.lost = why
            self._fail_requests(why, resumable=False)
            self._say_bye_on_ring(why)
        except* (NetworkError, ProtocolError) as group:
            reason = "; ".join(str(e) for e in group.exceptions)
            peer = self._failed_peer()
            self.state.lost = f"{peer} lost: {reason}"
            self.state.set_phase("lost", f"ring edge failed ({peer}): {reason}")
            self._fail_requests(f"member {peer} was lost: {reason}", lost=peer)
            with contextlib.suppress(KafilaError):
                await self.send_host(messages.Lost(peer, reason, self._assigned.epoch))

    def _say_bye_on_ring(self, why: str) -> None:
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

    def _fail_requests(self, reason: str, lost: str | None = None, resumable: bool = True) -> None:
        # resumable: the API servers send them again once the host has planned a ring without the lost member
        if self.head is not None:
            self.head.fail_all(reason, resumable=resumable)
        if self.forwarder is not None:  # the API server does not re-send what the lost head held
            self.forwarder.fail_all(reason, lost=lost, resumable=resumable)
        if self.api:
            self.api.chat = None

    def _trace_writer(self) -> Callable[[dict[str, Any]], None] | None:
        """Appends the head's batches as JSON lines to opts.trace_path (tests replay them on one context)."""
        path = self.opts.trace_path
        if path is None:
            return None

        def write(entry: dict[str, Any]) -> None:
            with open(path, "a") as f:
                f.write(json.dumps(entry) + "\n")

        return write

    async def _stage_loop(self, inbox: asyncio.Queue[bytes]) -> None:
        assert self.worker is not None and self.edges is not None and self.edges.next is not None
        nxt = self.edges.next
        while True:
            msg = await inbox.get()
            if messages.kind(msg) == "frame":
                frame = frames.decode(msg)
                out, ns = await self.worker.run(frame)
                await nxt.send(frames.encode(frame.passed(out, ns)))
                continue
            c = messages.decode(msg)
            if isinstance(c, messages.Bye):
                raise SessionEnded(c.reason)
            if isinstance(c, messages.Free):
                await self.worker.free(c.seq)
            elif isinstance(c, messages.Trim):
                await self.worker.free(c.seq, c.keep)
            elif isinstance(c, messages.ChatEvt) and self.forwarder is not None and self.forwarder.deliver(c):
                continue
            await nxt.send(msg)  # free, chat and others' chat_evt travel on around the ring

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
            for name, s in stats.stages.items():
                if name in self.state.stages:
                    self.state.stages[name].measured_s = s.measured_s
            self.state.network_share, self.state.tokens_per_s = stats.network_share, stats.tokens_per_s
            self.state.ttft = None if stats.ttft is None else asdict(stats.ttft)
            self.state.changed()
            # the coordinator may be gone: the ring serves on without it (see run), and reports to its successor
            with contextlib.suppress(NetworkError):
                await self.send_host(stats)

    async def _stop_serving(self, reason: str | None) -> None:
        if reason:
            self._fail_requests(reason)
        if self._serving is not None:
            self._serving.cancel()
            with contextlib.suppress(asyncio.CancelledError, KafilaError):
                await self._serving
            self._serving = None
        if self.edges is not None:
            for link in (self.edges.next, self.edges.prev):
                if link is not None:
                    await link.close()
            self.edges = None
        if self.worker is not None:
            await asyncio.to_thread(self.worker.close)
            self.worker = None
        self.head = self.forwarder = None


async def run_member(opts: MemberOptions, state: SessionState) -> int:
    """Join a session with a code and serve in it until the host ends it; returns an exit status."""
    state.role, state.me, state.code = "member", opts.name, opts.code
    cache = StageCache(opts.cache_dir)
    if opts.model is not None:
        opts = replace(opts, model=resolve_model(opts.model))  # a name or path, checked before anything else
    with start_cache_use(cache.root) as use:
        return await _serve_member(opts, state, cache, use)


async def _serve_member(opts: MemberOptions, state: SessionState, cache: StageCache, use: InUse) -> int:
    emulation = Emulation(opts.throttle, opts.memory_gb)
    claim: dict[str, str] = {}
    if opts.model is not None:
        state.set_phase("measuring", f"hashing {opts.model} (once per file: the hash is cached)")
        claim = await asyncio.to_thread(model_claim, cache, opts.model)
        state.log(f"holding the model {opts.model.name} (sha256 {claim['model_sha256']})")
    state.set_phase("measuring", "measuring this machine")
    result = await asyncio.to_thread(cached_probe, default_model_path(), cache, None, False, opts.threads)
    async with PeerEndpoint(bind=opts.bind, name=opts.name, idle_timeout_s=opts.link_idle_timeout_s,
                            allow_direct=opts.allow_direct, on_rendezvous=state.set_rendezvous) as ep:
        report = await ep.probe_nat(opts.rendezvous)
        meas = {**measurements(result, emulation), "role": "member", **claim}
        await ep.join_session(opts.rendezvous, opts.code)
        me = await ep.announce(meas)
        view = member_view(me)
        view.nat_evidence.update({"alt_port": report.mapped_alt_port, "alt_ip": report.mapped_alt_ip,
                                  "heard_change_ip_port": report.heard_change_ip_port,
                                  "heard_change_port": report.heard_change_port})
        state.upsert_member(view)
        state.set_phase("waiting", f"joined as {opts.name}; waiting for the host's plan")
        control = await connect_host(ep, opts.join_timeout_s)
        state.coordinator = control.peer.name
        api = None
        if opts.api_port is not None:
            api = await ApiServer(state, port=opts.api_port).start_or_none()
        try:
            return await MemberRuntime(ep, control, state, opts, cache, api, use).run()
        finally:
            if api:
                await api.stop()

"""The host: opens a session, waits for members, plans, delivers stages, admits or rejects, watches the ring.

The host coordinates, and its machine serves too: `run_host` runs an ordinary member in the same
process (its own endpoint, measured, planned and given a stage like any other), unless
`coordinate_only`. After a member is lost it plans again over the others when the model still fits
(a new epoch), so new requests are served by the smaller ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity
from kafila.errors import KafilaError, NetworkError, ProtocolError, SessionError
from kafila.model.cut import StageSpec
from kafila.model.describe import ModelInfo, describe_model
from kafila.model.embedded import resolve_model
from kafila.model.gguf_file import GGUFFile
from kafila.model.gguf_set import SHARD_NAME
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.planner import Member, ModelSpec, Plan, Workload, make_plan, predict_edge
from kafila.planner.placement import Placement
from kafila.session.api.server import ApiServer, Forwarder
from kafila.session.control.builds import RingBuilds, build_tag, judge_member
from kafila.session.delivery.cache_inventory import InUse, start_cache_use
from kafila.session.delivery.local_model import MODEL_KEY, claimed_hash, judge_model
from kafila.session.delivery.stage_files import manifest_for
from kafila.session.delivery.transfer import send_stage
from kafila.session.options import HostOptions, MemberOptions
from kafila.session.protocol import messages
from kafila.session.protocol.manifest import CHUNK_SIZE, StageManifest
from kafila.session.state import EdgeView, MemberView, SessionState, StageStats, member_view
from kafila.session.stoppable import run_stoppable

log = logging.getLogger("kafila.host")
EXIT_REJECTED = 3
OWN_MEMBER_STOP_S = 5.0  # how long the host's own member may take to close after the host's goodbye


def model_label(model: Path) -> str:
    """The name a user sees for a model: its file's stem (a GGUF's general.name is often a raw slug), without a
    split set's `-00001-of-0000N`; an Ollama blob is named by its digest, so there general.name it is."""
    m = SHARD_NAME.match(model.name)
    if m:
        return m.group("prefix")
    if model.name.startswith("sha256-") and not model.suffix:
        return str(GGUFFile(model).get("general.name", model.name))
    return model.stem


def planner_member(vm: VerifiedMember) -> Member:
    """The planner's view of a member's verified announcement."""
    m = vm.measurements
    try:
        emu = m.get("emu") or {}
        return Member(vm.name, float(m["bw"]), float(m["disp"]), int(m["mem"]), float(vm.rtt_ms or 0.0),
                      vm.nat_class, float(m["ubw"]), unembed_s=float(m.get("uo", 0.0)),
                      block_s=float(m.get("blk", 0.0)),
                      # prefill and the machine: absent from an older member's announcement (no TTFT then)
                      prefill_bandwidth=float(m.get("pbw", 0.0)), prefill_dispatch_s=float(m.get("pdisp", 0.0)),
                      prefill_block_s=float(m.get("pblk", 0.0)), prefill_rows=int(m.get("prow", 0)),
                      prefill_attn_s=float(m.get("patt", 0.0)),
                      machine=str(m.get("mach", "")), throttle=float(emu.get("throttle", 1.0)))
    except (KeyError, TypeError, ValueError):
        raise SessionError(f"member {vm.name} announced no usable measurements") from None


@dataclass
class Joined:
    """A member connected to the host."""

    peer: VerifiedMember
    link: Link
    loaded: asyncio.Future[messages.Loaded] | None = None  # this epoch's replies
    ready: asyncio.Future[messages.Ready] | None = None
    manifest: StageManifest | None = None
    stage_path: Path | None = None
    sending: set[asyncio.Task[None]] = field(default_factory=set)
    progress_at: float = 0.0  # loop time of the last sign of progress: stage bytes moving, any message
    step: str = "receiving its stage"  # what it was doing then, for a person


class HostRuntime:
    """The host's session after it is open (see run_host)."""

    def __init__(self, ep: PeerEndpoint, opts: HostOptions, state: SessionState, model: Path, info: ModelInfo,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None, beside: str | None = None,
                 serving: messages.Assign | None = None, departed: frozenset[str] = frozenset()) -> None:
        self.ep, self.opts, self.state, self.model, self.info, self.cache, self.api = (
            ep, opts, state, model, info, cache, api)
        self.beside = beside  # the ring member in this process (lost with it); None: this process only coordinates
        self.serving = serving  # a ring already serving, to take over as it is (its coordinator held no stage)
        self.departed = set(departed)  # ring members lost so far: one that comes back (restarted) may rejoin
        self.order: list[str] = []  # the ring serving now (empty before the first admission)
        self._replanning = False  # a loss ended this epoch: members' reports of it are stale (_on_lost_report)
        self.use = use  # the cut stages this session serves: `kafila cache --prune` leaves them
        self.joined: dict[str, Joined] = {}
        self.lost: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.forwarder: Forwarder | None = None
        self.epoch = 0
        self.plan: Plan | None = None
        self._arrived = asyncio.Event()
        self.my_build = build_tag(build_identity())
        self._handlers: dict[type[messages.Control], Callable[[Joined, Any], None]] = {
            messages.Need: self._on_need,
            messages.Working: self._on_working,
            messages.Loaded: self._on_loaded,
            messages.Ready: self._on_ready,
            messages.Lost: self._on_lost_report,
            messages.Stats: self._on_stats,
            messages.ChatEvt: self._on_chat_evt,
        }
        self.builds = RingBuilds(self.my_build)
        self._model_sha256: str | None = None  # hashed when a member first announces its own copy

    async def _model_refusal(self, peer: VerifiedMember) -> str | None:
        """Why a member's own model file (join --model) is refused: None when it has none or it is the host's."""
        if MODEL_KEY not in peer.measurements:
            return None
        if self._model_sha256 is None:
            self._model_sha256 = await asyncio.to_thread(self.cache.source_hash, self.model)
        return judge_model(self._model_sha256, peer.name, peer.measurements)

    async def run(self) -> int:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            accept = tg.create_task(self._accept_loop())
            try:
                await self._wait_for_members()
                status = None if self.serving is None else await self._adopt(self.serving)
                while status is None:
                    status = await self._epoch()
                return status
            finally:
                accept.cancel()
                for j in self.joined.values():
                    with contextlib.suppress(KafilaError):
                        j.link.post(messages.encode(messages.Bye("the host is closing the session")))
                await asyncio.sleep(0.2)  # let the goodbyes leave before the endpoint closes

    # -- members arriving -----------------------------------------------------------------------
    async def _accept_loop(self) -> None:
        while True:
            try:
                link = await self.ep.accept(timeout_s=3600)
            except TimeoutError:
                continue
            peer = link.peer
            view = member_view(peer)
            verdict = judge_member(self.my_build, peer.measurements, self.opts.mixed_builds)
            refusal = verdict.reason if not verdict.admitted else await self._model_refusal(peer)
            if refusal is not None:
                reason = refusal
                view.status, view.note = "refused", reason
                self.state.upsert_member(view)
                self.state.log(f"refused {peer.name}: {reason}")
                with contextlib.suppress(KafilaError):
                    await link.send(messages.encode(messages.Refused(reason)))
                continue
            if peer.name in self.departed and peer.name not in self.joined:
                self.builds.add(peer.name, verdict)
                self._hold(peer, link, view)  # a lost member back (a restarted host's machine): the next plan has it
                continue
            if peer.name in self.joined or (self.state.plan is not None and self.state.phase == "admitted"):
                with contextlib.suppress(KafilaError):
                    why = "a member of that name is already in the session (join with another --name)" \
                        if peer.name in self.joined else \
                        "the session is already planned"
                    await link.send(messages.encode(messages.Refused(why)))
                continue
            self.joined[peer.name] = Joined(peer, link)
            self.builds.add(peer.name, verdict)
            self.state.upsert_member(view)
            self.state.log(f"{peer.name} joined ({len(self.joined)}/{self.expected})")
            self._tg.create_task(self._recv_loop(peer.name, link))
            self._arrived.set()

    def _hold(self, peer: VerifiedMember, link: Link, view: MemberView) -> None:
        """Take back a member lost earlier; while a ring serves it waits, unplanned, for the next plan."""
        self.departed.discard(peer.name)
        self.joined[peer.name] = Joined(peer, link)
        waiting = self.state.phase == "admitted"
        if waiting:
            view.note = "rejoined: the next re-plan includes it"
        self.state.upsert_member(view)
        self.state.log(f"{peer.name} rejoined the session" + ("; the next re-plan includes it" if waiting else ""))
        self._tg.create_task(self._recv_loop(peer.name, link))
        self._arrived.set()

    @property
    def expected(self) -> int:
        """How many members to wait for: those asked for, and the host's own machine unless it only coordinates."""
        return self.opts.members + (0 if self.opts.coordinate_only else 1)

    async def _wait_for_members(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.wait_s
        while len(self.joined) < self.expected:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - loop.time()))
            if loop.time() >= deadline:
                break
        if not self.joined:
            raise SessionError(f"no member joined within {self.opts.wait_s:.0f} s")

    async def _recv_loop(self, name: str, link: Link) -> None:
        try:
            while True:
                msg = messages.decode(await link.recv())
                j = self.joined.get(name)
                handler = self._handlers.get(type(msg))
                if j is None:
                    return
                j.progress_at = asyncio.get_running_loop().time()
                if handler is None:
                    log.warning("ignored a %r message from %s", msg.T, name)
                    continue
                handler(j, msg)
        except (NetworkError, ProtocolError) as exc:
            if name in self.joined:
                self.lost.put_nowait((name, str(exc)))

    async def _tell(self, name: str, msg: messages.Control | bytes) -> bool:
        """Send to a member; a failed send is that member's loss (queued like any other), not an error."""
        j = self.joined.get(name)
        if j is None:
            return False
        try:
            await j.link.send(msg if isinstance(msg, bytes) else messages.encode(msg))
        except NetworkError as exc:
            self.lost.put_nowait((name, str(exc)))
            return False
        return True

    # -- control messages from members (one handler per type) -----------------------------------
    def _on_need(self, j: Joined, msg: messages.Need) -> None:
        if msg.epoch != self.epoch:
            return
        task = self._tg.create_task(self._send_chunks(j, list(msg.chunks)))
        j.sending.add(task)
        task.add_done_callback(j.sending.discard)

    def _on_working(self, j: Joined, msg: messages.Working) -> None:
        if msg.epoch == self.epoch:  # the message itself was progress (_recv_loop); what it says is for people
            j.step = msg.step

    def _on_loaded(self, j: Joined, msg: messages.Loaded) -> None:
        if msg.epoch == self.epoch and j.loaded is not None and not j.loaded.done():
            j.loaded.set_result(msg)
            self.state.update_member(j.peer.name, status="loaded")

    def _on_ready(self, j: Joined, msg: messages.Ready) -> None:
        if msg.epoch == self.epoch and j.ready is not None and not j.ready.done():
            j.ready.set_result(msg)
            self.state.update_member(j.peer.name, status="ready")

    def _on_lost_report(self, j: Joined, msg: messages.Lost) -> None:
        # A report of an epoch already given up is stale: when a member stops serving on the coordinator's
        # word it closes its ring edges, and a neighbour still serving reports it lost, alive as it is. A
        # member truly gone is lost on its own link to the coordinator too (_recv_loop), so none is missed.
        if msg.epoch != self.epoch or self._replanning:
            log.info("ignored %s's stale report of epoch %d: %s lost (%s)", j.peer.name, msg.epoch, msg.who, msg.reason)
            return
        self.lost.put_nowait((msg.who, msg.reason))

    def _on_stats(self, j: Joined, msg: messages.Stats) -> None:
        for stage, s in msg.stages.items():
            if stage in self.state.stages:
                self.state.stages[stage].measured_s = s.measured_s
        self.state.network_share, self.state.tokens_per_s = msg.network_share, msg.tokens_per_s
        self.state.ttft = None if msg.ttft is None else asdict(msg.ttft)
        self.state.changed()

    def _on_chat_evt(self, j: Joined, msg: messages.ChatEvt) -> None:
        if self.forwarder is not None:
            self.forwarder.deliver(msg)

    async def _send_chunks(self, j: Joined, chunks: list[int]) -> None:
        assert j.manifest is not None and j.stage_path is not None
        name, total = j.peer.name, j.manifest.size
        done = total - len(chunks) * j.manifest.chunk_size

        def progress(n: int) -> None:
            nonlocal done
            done += n
            j.progress_at = asyncio.get_running_loop().time()
            j.step = "receiving its stage"
            self.state.delivery[name] = (min(max(done, 0), total), total)
            self.state.changed()

        try:
            sent_bytes = await send_stage(j.link, j.stage_path, j.manifest, chunks, progress)
        except NetworkError as exc:  # the member is gone: a loss like any other, the epoch re-plans
            log.info("stopped sending %s its stage: %s", name, exc)
            self.lost.put_nowait((name, str(exc)))
            return
        self.state.delivery[name] = (total, total)
        self.state.log(f"stage delivered to {j.peer.name}: {sent_bytes} bytes sent")

    # -- one epoch: plan, deliver, admit, watch -------------------------------------------------
    async def _epoch(self) -> int | None:
        """Plan and serve once; None to plan again (after a loss), else the exit status."""
        self.epoch += 1
        self._replanning = False
        names = sorted(self.joined)
        self.state.set_phase("planning", f"planning over {', '.join(names)}")
        members = [planner_member(self.joined[n].peer) for n in names]
        workload = Workload(self.opts.concurrency, self.opts.context, self.opts.batch)
        plan = make_plan(members, ModelSpec.described(self.info), workload)
        placement = plan.placement(self.opts.strategy)
        self.plan = plan
        self.state.plan = plan.to_json(self.opts.strategy)
        self.state.plan["builds"] = self.state.builds = self.builds.for_members(names)
        self.state.predicted = {a.name: {b.name: predict_edge(a.nat, b.nat) for b in members if b.name != a.name}
                                for a in members}
        if not placement.feasible:
            reason = plan.admission.text if plan.admission else str(placement.reason)
            self.state.rejection = reason
            self.state.set_phase("rejected", f"rejected: {reason}")
            for j in self.joined.values():
                with contextlib.suppress(KafilaError):
                    await j.link.send(messages.encode(messages.Reject(reason)))
            return EXIT_REJECTED
        order = list(placement.order)
        self.state.edges = [EdgeView(a, b, self.state.predicted[a][b])
                            for a, b in zip(order, order[1:] + order[:1], strict=True) if a != b]
        self.state.stages = {n: StageStats(float(s)) for n, s in self.state.plan["stage_seconds"].items()}
        self.state.set_phase("delivering", f"ring {' → '.join(order)} (head {placement.head}); cutting stages")
        # two steps, so that nobody opens ring edges while a neighbour is still receiving its stage
        await self._assign(placement)
        loss = await self._wait_all(order, "loaded")
        if loss is None:
            for n in order:
                await self._tell(n, messages.Connect(self.epoch))
            self.state.set_phase("connecting", "every stage is loaded; opening the ring's edges")
            loss = await self._wait_all(order, "ready")
        if loss is not None:
            return await self._on_lost(*loss)
        self._record_edges(order)
        self.order = order
        self.forwarder = Forwarder("host", self.joined[order[0]].link.send)
        if self.api is not None:
            self.api.chat = self.forwarder.chat
        for n in order:
            await self._tell(n, messages.Admit(self.epoch))
            self.state.update_member(n, status="serving")
        roster = self._roster(order)
        for n in order:  # the coordinator's state, so that the ring outlives the host (member.py)
            await self._tell(n, roster)
        self.state.lost = None
        self.state.set_phase("admitted", f"admitted: {len(order)} members, head {placement.head}")
        who, reason = await self._next_loss()
        return await self._on_lost(who, reason)

    async def _adopt(self, assign: messages.Assign) -> int | None:
        """Coordinate the ring of `assign`, which serves on without its coordinator; None to plan again.

        Nothing is planned, cut or sent: each member keeps its stage and edges, and only its control link
        moves here. A member of the ring that never connected is lost, and the others are planned again.
        """
        self.epoch = assign.epoch  # the members' epoch goes on: their reports name it
        order = list(assign.order)
        self.state.plan, self.state.model = assign.plan, assign.model
        self.state.stages = {n: StageStats(float(s)) for n, s in assign.stage_seconds.items()}
        missing = [n for n in order if n not in self.joined]
        if missing:
            status = None
            for n in missing:
                status = await self._on_lost(n, "it did not reach the member that took coordination over")
            return status
        self.order = order
        for n in order:
            self.state.update_member(n, status="serving")
        roster = self._roster(order)
        for n in order:
            await self._tell(n, roster)
        self.state.set_phase("admitted", f"took the serving ring over: {len(order)} members, head {assign.head}")
        who, reason = await self._next_loss()
        return await self._on_lost(who, reason)

    async def _next_loss(self) -> tuple[str, str]:
        """The next loss of a member still in the session (a late report of an earlier loss is no news).

        A member waiting for the next plan (one that rejoined while the ring served) is dropped without a
        re-plan: the ring serving lost nothing.
        """
        while True:
            who, reason = await self.lost.get()
            if who in self.joined and self.order and who not in self.order and self.state.phase == "admitted":
                waiting = self.joined.pop(who)
                self.departed.add(who)
                self.state.update_member(who, status="lost", note=reason)
                self.state.log(f"{who}, waiting for the next plan, left: {reason}")
                with contextlib.suppress(KafilaError):
                    await waiting.link.close()
                continue
            if who in self.joined:
                return who, reason

    def _roster(self, order: list[str]) -> messages.Roster:
        """Who serves and what each measured, as the planner saw them (replicated to every member)."""
        measured = {}
        for n in order:
            m = planner_member(self.joined[n].peer)
            measured[n] = messages.Measured(m.bandwidth, m.dispatch_s, m.memory, m.unembed_bandwidth or m.bandwidth,
                                            m.nat.value, self.joined[n].peer.rtt_ms)
        holders = tuple(n for n in order if claimed_hash(self.joined[n].peer.measurements) is not None)
        return messages.Roster(self.state.me or "host", model_label(self.model), measured, self.beside, holders,
                               self._model_sha256, self.opts.strategy, self.opts.mixed_builds)

    async def _assign(self, plan: Placement) -> None:
        """Cut every member's stage and assign it, all at once: each member's delivery starts as soon as its
        stage is cut, and the host feeds several members concurrently (one sender each)."""
        for j in self.joined.values():
            for task in list(j.sending):
                task.cancel()  # a stage of an earlier epoch is no longer wanted
        loop = asyncio.get_running_loop()
        for name in plan.order:
            j = self.joined[name]
            j.loaded, j.ready = loop.create_future(), loop.create_future()
        await run_stoppable(partial(self.cache.source_hash, self.model))  # once, before the cuts read it at once
        try:
            async with asyncio.TaskGroup() as tg:
                for name in plan.order:
                    tg.create_task(self._assign_one(plan, name))
        except* KafilaError as group:  # the CLI shows one error, not a group
            raise group.exceptions[0] from None

    async def _assign_one(self, plan: Placement, name: str) -> None:
        order = list(plan.order)
        config = {"n_ctx_per_seq": self.opts.context, "n_seq_max": self.opts.concurrency, "n_batch": self.opts.batch}
        start, end = plan.ranges[name]
        j = self.joined[name]
        # cut and hashed on a worker thread that stops with this task (a SIGTERM mid-cut)
        spec = StageSpec(start, end, head=(name == plan.head))
        j.stage_path = await run_stoppable(partial(self.cache.stage, self.model, spec))
        if self.use is not None:
            self.use.add(j.stage_path)
        j.manifest = await run_stoppable(partial(manifest_for, j.stage_path, CHUNK_SIZE))
        self.state.delivery[name] = (0, j.manifest.size)
        cut_local = claimed_hash(j.peer.measurements) is not None  # admitted, so it is the host's model
        if cut_local:
            self.state.log(f"{name} holds the model (same sha256): it cuts its stage itself")
        await self._tell(name, messages.Assign(
            self.epoch, tuple(order), order[0], {n: (r[0], r[1]) for n, r in plan.ranges.items()}, config,
            self.state.plan or {}, model_label(self.model), j.manifest, cut_local))

    async def _wait_all(self, order: list[str], kind: str) -> tuple[str, str] | None:
        """Until every member of `order` has sent `kind` (None), or a member is lost first: (who, reason).

        No fixed deadline: a multi-GB stage may take an hour to arrive over a slow link. A member is lost
        when its link is, or when it shows no progress (stage bytes moving, a `working` or other message)
        for `stall_s`: then it is named, with what it was doing, and the host plans again without it.
        """
        loop = asyncio.get_running_loop()
        waits: dict[str, asyncio.Future[Any]] = {}
        for n in order:
            j = self.joined[n]
            fut = j.loaded if kind == "loaded" else j.ready
            assert fut is not None
            waits[n] = fut
            j.progress_at = loop.time()
            j.step = "opening its ring edges" if kind == "ready" else "receiving its stage"
        stall = self.opts.stall_s
        lost_wait = asyncio.ensure_future(self._next_loss())
        try:
            pending: set[asyncio.Future[Any]] = set(waits.values())
            while pending:
                now = loop.time()
                quiet = {n: now - self.joined[n].progress_at for n, f in waits.items() if f in pending}
                stalled = max(quiet, key=lambda n: quiet[n])
                if quiet[stalled] >= stall:
                    j = self.joined[stalled]
                    sent = self.state.delivery.get(stalled)
                    where = f" ({sent[0] / 1e6:.1f} of {sent[1] / 1e6:.1f} MB sent)" \
                        if sent is not None and j.step == "receiving its stage" else ""
                    reason = f"made no progress for {stall:g} s while {j.step}{where}"
                    self.state.log(f"{stalled} {reason}")
                    return stalled, reason
                done, pending = await asyncio.wait(pending | {lost_wait}, timeout=stall - quiet[stalled],
                                                   return_when=asyncio.FIRST_COMPLETED)
                pending.discard(lost_wait)
                if lost_wait in done:
                    return lost_wait.result()
        finally:
            if not lost_wait.done():
                lost_wait.cancel()
        return None

    def _record_edges(self, order: list[str]) -> None:
        """Each member's `ready` reports its outgoing ring edge: predicted against what happened."""
        for a, b in zip(order, order[1:] + order[:1], strict=True):
            ready = self.joined[a].ready
            edge = ready.result().edge if ready is not None and ready.done() else None
            if a != b and edge is not None:
                actual = {"direct": "direct", "relay": "relayed"}.get(edge.actual, "failed")
                self.state.set_edge(a, b, actual, edge.ready_ms)
                self.state.log(f"edge {a} → {b}: predicted {self.state.predicted[a][b]}, {actual}"
                               f" (usable after {edge.ready_ms} ms)")

    async def _on_lost(self, who: str, reason: str) -> int | None:
        self._replanning = True  # this epoch is over: its members' reports from now on are stale
        self.state.lost = f"{who}: {reason}"
        self.state.update_member(who, status="lost", note=reason)
        self.state.set_phase("lost", f"member {who} was lost: {reason}")
        if self.forwarder is not None:
            self.forwarder.fail_all(f"member {who} was lost: {reason}", lost=who)
        if self.api is not None:
            self.api.chat = None
        for j in self.joined.values():  # chunks of this epoch's stages must not reach the next epoch
            for task in list(j.sending):
                task.cancel()
        gone = self.joined.pop(who, None)
        self.departed.add(who)
        if gone is not None:
            with contextlib.suppress(KafilaError):
                await gone.link.close()
        for name in list(self.joined):
            await self._tell(name, messages.Lost(who, reason, self.epoch))
        # the same loss is often reported by its neighbours and by its own link: keep other losses only
        others = [self.lost.get_nowait() for _ in range(self.lost.qsize())]
        for other in others:
            if other[0] != who and other[0] in self.joined:
                self.lost.put_nowait(other)
        if not self.opts.replan or not self.joined:
            return 1
        self.state.log("planning again over the remaining members")
        return None


def coordinator_announcement() -> dict[str, str]:
    """What a coordinator's endpoint announces (the host's, or a member's that took coordination over)."""
    return {"role": "host", "build": build_tag(build_identity())}


def relay_events(source: SessionState, into: SessionState, prefix: str) -> None:
    """Show every event of `source` (a coordinator or member beside the main one) in `into`'s log."""
    shown = 0

    def relay(s: SessionState) -> None:
        nonlocal shown
        for _, text in s.events[shown:]:
            into.log(f"{prefix}{text}")
        shown = len(s.events)

    source.subscribe(relay)


async def run_host(opts: HostOptions, state: SessionState) -> int:
    """Open a session and run it until it ends; returns an exit status (3: rejected)."""
    state.role, state.me = "host", "host"
    state.coordinator = "host"
    model = resolve_model(opts.model)
    info = describe_model(model)
    state.model = model_label(model)
    cache = StageCache(opts.cache_dir)
    with start_cache_use(cache.root) as use:
        return await _serve_host(opts, state, model, info, cache, use)


async def _serve_host(opts: HostOptions, state: SessionState, model: Path, info: ModelInfo, cache: StageCache,
                      use: InUse) -> int:
    async with PeerEndpoint(bind=opts.bind, name="host", idle_timeout_s=opts.link_idle_timeout_s,
                            allow_direct=opts.allow_direct, on_rendezvous=state.set_rendezvous) as ep:
        await ep.probe_nat(opts.rendezvous)
        code = await ep.create_session(opts.rendezvous, opts.secret)
        state.code = str(code)
        await ep.announce(coordinator_announcement())
        state.set_phase("waiting", f"session open; join code {code}")
        api = None
        if opts.api_port is not None:
            api = await ApiServer(state, port=opts.api_port).start_or_none()
        # not in a TaskGroup: the host's own errors must reach the CLI as they are, not wrapped in a group
        own = None if opts.coordinate_only else asyncio.create_task(_own_member(opts, str(code), state))
        try:
            beside = None if opts.coordinate_only else opts.name
            return await HostRuntime(ep, opts, state, model, info, cache, api, use, beside).run()
        finally:
            if own is not None:  # it has had the host's goodbye; it ends with the host in any case
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(own), OWN_MEMBER_STOP_S)
                own.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await own
            if api is not None:
                await api.stop()


async def _own_member(opts: HostOptions, code: str, host_state: SessionState) -> None:
    """This machine as an ordinary member of its own session (its events go to the host's log).

    Its end is not the session's: the host sees it as a lost member, like any other.
    """
    from kafila.session.control.member import run_member

    mine = SessionState()
    relay_events(mine, host_state, f"{opts.name} (this machine): ")
    member_opts = MemberOptions(code=code, rendezvous=opts.rendezvous, name=opts.name, api_port=None,
                                cache_dir=opts.cache_dir, link_idle_timeout_s=opts.link_idle_timeout_s,
                                allow_direct=opts.allow_direct, threads=opts.threads)
    try:
        await run_member(member_opts, mine)
    except KafilaError as exc:
        host_state.log(f"{opts.name} (this machine) left the ring: {exc}")

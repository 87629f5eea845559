"""The host: opens a session, waits for members, plans, delivers stages, admits or rejects, watches the ring.

The host coordinates; it holds the GGUF but serves no blocks itself (run `kafila join` beside it
to put its machine in the ring too). After a member is lost it plans again over the others when
the model still fits (a new epoch), so new requests are served by the smaller ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity
from kafila.errors import KafilaError, NetworkError, ProtocolError, SessionError
from kafila.model.cut import StageSpec
from kafila.model.describe import ModelInfo, describe_model
from kafila.model.embedded import resolve_model
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.planner import Member, ModelSpec, Plan, Workload, make_plan, predict_edge
from kafila.planner.placement import Placement
from kafila.session import messages
from kafila.session.api import ApiServer, Forwarder
from kafila.session.builds import RingBuilds, build_tag, judge_member
from kafila.session.cache_inventory import InUse, start_cache_use
from kafila.session.delivery import StageManifest, manifest_for, read_chunk
from kafila.session.options import HostOptions
from kafila.session.state import EdgeView, SessionState, StageStats, member_view

log = logging.getLogger("kafila.host")
READY_TIMEOUT_S = 300.0  # stage delivery + loading + ring edges, per epoch
EXIT_REJECTED = 3


def model_label(model: Path) -> str:
    """The name a user sees for a model: its file's stem (a GGUF's general.name is often a raw slug)."""
    return model.stem


def planner_member(vm: VerifiedMember) -> Member:
    """The planner's view of a member's verified announcement."""
    m = vm.measurements
    try:
        return Member(vm.name, float(m["bw"]), float(m["disp"]), int(m["mem"]), float(vm.rtt_ms or 0.0),
                      vm.nat_class, float(m["ubw"]))
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


class HostRuntime:
    """The host's session after it is open (see run_host)."""

    def __init__(self, ep: PeerEndpoint, opts: HostOptions, state: SessionState, model: Path, info: ModelInfo,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None) -> None:
        self.ep, self.opts, self.state, self.model, self.info, self.cache, self.api = (
            ep, opts, state, model, info, cache, api)
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
            messages.Loaded: self._on_loaded,
            messages.Ready: self._on_ready,
            messages.Lost: self._on_lost_report,
            messages.Stats: self._on_stats,
            messages.ChatEvt: self._on_chat_evt,
        }
        self.builds = RingBuilds(self.my_build)

    async def run(self) -> int:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            accept = tg.create_task(self._accept_loop())
            try:
                await self._wait_for_members()
                while True:
                    status = await self._epoch()
                    if status is not None:
                        return status
            finally:
                accept.cancel()
                for j in self.joined.values():
                    with contextlib.suppress(KafilaError):
                        await j.link.send(messages.encode(messages.Bye("the host is closing the session")))
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
            if not verdict.admitted:
                reason = verdict.reason
                view.status, view.note = "refused", reason
                self.state.upsert_member(view)
                self.state.log(f"refused {peer.name}: {reason}")
                with contextlib.suppress(KafilaError):
                    await link.send(messages.encode(messages.Refused(reason)))
                continue
            if peer.name in self.joined or (self.plan is not None and self.state.phase == "admitted"):
                with contextlib.suppress(KafilaError):
                    why = "a member of that name is already in the session" if peer.name in self.joined else \
                        "the session is already planned"
                    await link.send(messages.encode(messages.Refused(why)))
                continue
            self.joined[peer.name] = Joined(peer, link)
            self.builds.add(peer.name, verdict)
            self.state.upsert_member(view)
            self.state.log(f"{peer.name} joined ({len(self.joined)}/{self.opts.members})")
            self._tg.create_task(self._recv_loop(peer.name, link))
            self._arrived.set()

    async def _wait_for_members(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.wait_s
        while len(self.joined) < self.opts.members:
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
                if handler is None:
                    log.warning("ignored a %r message from %s", msg.T, name)
                    continue
                handler(j, msg)
        except (NetworkError, ProtocolError) as exc:
            if name in self.joined:
                self.lost.put_nowait((name, str(exc)))

    # -- control messages from members (one handler per type) -----------------------------------
    def _on_need(self, j: Joined, msg: messages.Need) -> None:
        if msg.epoch != self.epoch:
            return
        task = self._tg.create_task(self._send_chunks(j, list(msg.chunks)))
        j.sending.add(task)
        task.add_done_callback(j.sending.discard)

    def _on_loaded(self, j: Joined, msg: messages.Loaded) -> None:
        if msg.epoch == self.epoch and j.loaded is not None and not j.loaded.done():
            j.loaded.set_result(msg)
            self.state.update_member(j.peer.name, status="loaded")

    def _on_ready(self, j: Joined, msg: messages.Ready) -> None:
        if msg.epoch == self.epoch and j.ready is not None and not j.ready.done():
            j.ready.set_result(msg)
            self.state.update_member(j.peer.name, status="ready")

    def _on_lost_report(self, j: Joined, msg: messages.Lost) -> None:
        self.lost.put_nowait((msg.who, msg.reason))

    def _on_stats(self, j: Joined, msg: messages.Stats) -> None:
        for stage, s in msg.stages.items():
            if stage in self.state.stages:
                self.state.stages[stage].measured_s = s.measured_s
        self.state.network_share, self.state.tokens_per_s = msg.network_share, msg.tokens_per_s
        self.state.changed()

    def _on_chat_evt(self, j: Joined, msg: messages.ChatEvt) -> None:
        if self.forwarder is not None:
            self.forwarder.deliver(msg)

    async def _send_chunks(self, j: Joined, chunks: list[int]) -> None:
        assert j.manifest is not None and j.stage_path is not None
        total = j.manifest.size
        sent = total - len(chunks) * j.manifest.chunk_size
        for i in chunks:
            data = await asyncio.to_thread(read_chunk, j.stage_path, j.manifest, i)
            await j.link.send(messages.chunk(i, data))
            sent += len(data)
            self.state.delivery[j.peer.name] = (min(max(sent, 0), total), total)
            self.state.changed()
        self.state.delivery[j.peer.name] = (total, total)
        self.state.changed()

    # -- one epoch: plan, deliver, admit, watch -------------------------------------------------
    async def _epoch(self) -> int | None:
        """Plan and serve once; None to plan again (after a loss), else the exit status."""
        self.epoch += 1
        names = sorted(self.joined)
        self.state.set_phase("planning", f"planning over {', '.join(names)}")
        members = [planner_member(self.joined[n].peer) for n in names]
        workload = Workload(self.opts.concurrency, self.opts.context)
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
                await self.joined[n].link.send(messages.encode(messages.Connect(self.epoch)))
            self.state.set_phase("connecting", "every stage is loaded; opening the ring's edges")
            loss = await self._wait_all(order, "ready")
        if loss is not None:
            return await self._on_lost(*loss)
        self._record_edges(order)
        self.forwarder = Forwarder("host", self.joined[order[0]].link.send)
        if self.api is not None:
            self.api.chat = self.forwarder.chat
        for n in order:
            await self.joined[n].link.send(messages.encode(messages.Admit(self.epoch)))
            self.state.update_member(n, status="serving")
        self.state.lost = None
        self.state.set_phase("admitted", f"admitted: {len(order)} members, head {placement.head}")
        who, reason = await self.lost.get()
        return await self._on_lost(who, reason)

    async def _assign(self, plan: Placement) -> None:
        order = list(plan.order)
        config = {"n_ctx_per_seq": self.opts.context, "n_seq_max": self.opts.concurrency, "n_batch": self.opts.batch}
        for name in order:
            start, end = plan.ranges[name]
            spec = StageSpec(start, end, head=(name == plan.head))
            j = self.joined[name]
            j.stage_path = await asyncio.to_thread(self.cache.stage, self.model, spec)
            if self.use is not None:
                self.use.add(j.stage_path)
            j.manifest = await asyncio.to_thread(manifest_for, j.stage_path)
            loop = asyncio.get_running_loop()
            j.loaded, j.ready = loop.create_future(), loop.create_future()
            self.state.delivery[name] = (0, j.manifest.size)
            await j.link.send(messages.encode(messages.Assign(
                self.epoch, tuple(order), order[0], {n: (r[0], r[1]) for n, r in plan.ranges.items()}, config,
                self.state.plan or {}, model_label(self.model), j.manifest)))

    async def _wait_all(self, order: list[str], kind: str) -> tuple[str, str] | None:
        """Until every member of `order` has sent `kind` (None), or a member is lost first: (who, reason)."""
        waits: dict[str, asyncio.Future[Any]] = {}
        for n in order:
            fut = self.joined[n].loaded if kind == "loaded" else self.joined[n].ready
            assert fut is not None
            waits[n] = fut
        lost_wait = asyncio.ensure_future(self.lost.get())
        try:
            pending: set[asyncio.Future[Any]] = set(waits.values())
            deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_S
            while pending:
                timeout = deadline - asyncio.get_running_loop().time()
                if timeout <= 0:
                    late = [n for n, f in waits.items() if f in pending]
                    raise SessionError(f"members {late} did not report '{kind}' within {READY_TIMEOUT_S:.0f} s")
                done, pending = await asyncio.wait(pending | {lost_wait}, timeout=timeout,
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
        self.state.lost = f"{who}: {reason}"
        self.state.update_member(who, status="lost", note=reason)
        self.state.set_phase("lost", f"member {who} was lost: {reason}")
        if self.forwarder is not None:
            self.forwarder.fail_all(f"member {who} was lost: {reason}", lost=who)
        if self.api is not None:
            self.api.chat = None
        gone = self.joined.pop(who, None)
        if gone is not None:
            with contextlib.suppress(KafilaError):
                await gone.link.close()
        for j in self.joined.values():
            with contextlib.suppress(KafilaError):
                await j.link.send(messages.encode(messages.Lost(who, reason, self.epoch)))
        # the same loss is often reported by its neighbours and by its own link: keep other losses only
        others = [self.lost.get_nowait() for _ in range(self.lost.qsize())]
        for other in others:
            if other[0] != who and other[0] in self.joined:
                self.lost.put_nowait(other)
        if not self.opts.replan or not self.joined:
            return 1
        self.state.log("planning again over the remaining members")
        return None


async def run_host(opts: HostOptions, state: SessionState) -> int:
    """Open a session and run it until it ends; returns an exit status (3: rejected)."""
    state.role, state.me = "host", "host"
    model = resolve_model(opts.model)
    info = describe_model(model)
    state.model = model_label(model)
    cache = StageCache(opts.cache_dir)
    with start_cache_use(cache.root) as use:
        return await _serve_host(opts, state, model, info, cache, use)


async def _serve_host(opts: HostOptions, state: SessionState, model: Path, info: ModelInfo, cache: StageCache,
                      use: InUse) -> int:
    async with PeerEndpoint(bind=opts.bind, name="host", idle_timeout_s=opts.link_idle_timeout_s,
                            allow_direct=opts.allow_direct) as ep:
        await ep.probe_nat(opts.rendezvous)
        code = await ep.create_session(opts.rendezvous, opts.secret)
        state.code = str(code)
        await ep.announce({"role": "host", "build": build_tag(build_identity())})
        state.set_phase("waiting", f"session open; join code {code}")
        api = None
        if opts.api_port is not None:
            api = ApiServer(state, port=opts.api_port)
            await api.start()
        try:
            return await HostRuntime(ep, opts, state, model, info, cache, api, use).run()
        finally:
            if api is not None:
                await api.stop()

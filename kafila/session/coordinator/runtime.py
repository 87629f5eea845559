"""The coordinator a session runs (the host's, or a member's that took coordination over): an asyncio shell
that only pumps its machine (machine.py).

Every input (a member's message on its authenticated link, a link's failure, a ping's answer, stages cut, the
stall timer) becomes one call on the machine, made in order from one queue; the effects it returns are carried
out in that order before the next input is read (effects.py). The door (admission.py) and the model copies
(model_copy.py) are its other parts: each owns its state and is handed what it needs.

    member link ─► recv loop ─► queue ─► Coordinator.handle(sender, msg, now) ─► effects ─► _apply
                                                                                   │
         sends, stage cuts and chunks, the API's forwarder, the roster ◄───────────┘
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity, build_tag
from kafila.errors import KafilaError, NetworkError, ProtocolError
from kafila.model.cut import StageSpec
from kafila.model.describe import ModelInfo
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.mandate import CREDENTIAL_KEY, Credential
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.session.api.server import ApiServer, Forwarder, ModelContext
from kafila.session.coordinator import effects as fx
from kafila.session.coordinator.admission import Admission, log
from kafila.session.coordinator.builds import BuildVerdict, RingBuilds
from kafila.session.coordinator.machine import Coordinator
from kafila.session.coordinator.planning import Planner, model_label, planner_member
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.delivery.local_model import claimed_hash
from kafila.session.delivery.model_copy_sender import ModelCopies
from kafila.session.delivery.model_source import offer_source
from kafila.session.delivery.stage_files import manifest_for
from kafila.session.delivery.transfer import send_stage
from kafila.session.options import HostOptions
from kafila.session.protocol import messages
from kafila.session.protocol.manifest import CHUNK_SIZE, StageManifest
from kafila.session.protocol.model_manifest import ModelSource
from kafila.session.state import SessionState
from kafila.session.stoppable import run_stoppable

Input = Callable[[], list[fx.Effect]]  # one call on the machine, made when the queue reaches it


@dataclass
class StageOut:
    """A member's stage of one epoch: cut, and sent to it chunk by chunk as it asks (each chunk once)."""

    epoch: int
    path: Path
    manifest: StageManifest
    asked: set[int] = field(default_factory=set)


class HostRuntime:
    """The host's session after it is open (see coordinator.session.coordinate_session)."""

    def __init__(self, ep: PeerEndpoint, opts: HostOptions, state: SessionState, model: Path, info: ModelInfo,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None, beside: str | None = None,
                 serving: messages.Assign | None = None, departed: frozenset[str] = frozenset(),
                 credential: Credential | None = None) -> None:
        self.ep, self.opts, self.state, self.model, self.info, self.cache, self.api, self.use = (
            ep, opts, state, model, info, cache, api, use)
        self.beside, self.serving, self.credential = beside, serving, credential
        my_build = build_tag(build_identity())
        self.builds = RingBuilds(my_build)
        self.machine = Coordinator(opts.settings, state, Planner(info, opts.settings), self.builds, departed)
        self.links: dict[str, Link] = {}
        self.stages: dict[str, StageOut] = {}
        self.door = Admission(ep, opts, state, model, cache, my_build, lambda: self.links, self._enter)
        self.door.departed = self.machine.departed
        self.copies = ModelCopies(state, opts.settings, model, beside, self._tell, self._spawn)
        self.forwarder: Forwarder | None = None
        self._inputs: asyncio.Queue[Input] = asyncio.Queue()
        self._rearm = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending: set[asyncio.Task[None]] = set()  # stage chunks of this epoch
        self._cutting: asyncio.Task[None] | None = None
        self._source: ModelSource | None = None  # the public URLs members fetch stages from (--source)
        self._source_offered = False
        self._done: asyncio.Future[int] | None = None

    async def run(self) -> int:
        """Coordinate until the session ends; returns its exit status."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        pump = self._spawn(self._pump())
        for job in (self._timer(), self.door.accept_loop()):
            self._spawn(job)
        reason = "the host is closing the session"
        try:
            await self.door.wait_for_members()
            first = self.serving
            self._feed(lambda: self.machine.start(loop.time()) if first is None
                       else self.machine.adopt(first, loop.time()))
            return await self._done
        except KafilaError as exc:  # the members still measuring say why, not only that the host went
            reason = f"the host ended the session: {exc}"
            raise
        finally:
            # members leave on the goodbyes: no news to a session that is over (it planned the ring again)
            pump.cancel()
            for link in [*self.links.values(), *(a.link for a in self.door.measuring.values())]:
                with contextlib.suppress(KafilaError):
                    link.post(messages.encode(messages.Bye(reason)))
            await asyncio.sleep(0.2)  # let the goodbyes leave before the endpoint closes
            for task in [*self._tasks, *self._sending]:
                task.cancel()
            await asyncio.gather(*self._tasks, *self._sending, return_exceptions=True)

    # -- the pump --------------------------------------------------------------------------------------
    def _spawn(self, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _feed(self, call: Input) -> None:
        self._inputs.put_nowait(call)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _pump(self) -> None:
        """Each input in turn, and its effects in order; an error in either ends the session with it."""
        assert self._done is not None
        try:
            # once the session's end is decided, later inputs (a rejected member's link closing) must not rewrite it
            while not self._done.done():
                call = await self._inputs.get()
                for effect in call():
                    await self._apply(effect)
                self._rearm.set()
        except Exception as exc:
            if not self._done.done():
                self._done.set_exception(exc)

    async def _timer(self) -> None:
        while True:
            self._rearm.clear()
            when = self.machine.next_timer()
            if when is None:
                await self._rearm.wait()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rearm.wait(), max(when - self._now(), 0.0))
                continue
            self._feed(lambda: self.machine.timer(self._now()))
            await self._rearm.wait()

    def _enter(self, peer: VerifiedMember, link: Link, verdict: BuildVerdict) -> None:
        """A member admitted by the door: its link is read from now on, and the machine hears of it."""
        self.links[peer.name] = link
        self.builds.add(peer.name, verdict)
        self._feed(lambda: self.machine.join(peer, self._now()))
        self._spawn(self._recv_loop(peer.name, link))

    async def _recv_loop(self, name: str, link: Link) -> None:
        try:
            while True:
                msg = messages.decode(await link.recv())
                self._feed(partial(self._handle, name, link, msg))
        except (NetworkError, ProtocolError) as exc:
            self._feed(partial(self._link_down, name, link, str(exc)))

    def _handle(self, name: str, link: Link, msg: messages.Control) -> list[fx.Effect]:
        return self.machine.handle(name, msg, self._now()) if self.links.get(name) is link else []

    def _link_down(self, name: str, link: Link, why: str) -> list[fx.Effect]:
        return self.machine.link_down(name, why, self._now()) if self.links.get(name) is link else []

    async def _tell(self, name: str, msg: messages.Control) -> bool:
        """Send to a member; a failed send is that member's loss (an input like any other), not an error."""
        link = self.links.get(name)
        if link is None:
            return False
        try:
            await link.send(messages.encode(msg))
        except NetworkError as exc:
            self._feed(partial(self._link_down, name, link, str(exc)))
            return False
        return True

    # -- the effects -----------------------------------------------------------------------------------
    async def _apply(self, e: fx.Effect) -> None:
        if isinstance(e, fx.Send):
            if not isinstance(e.msg, messages.Assign) or e.msg.epoch == self.machine.epoch:  # a stale cut's: no
                await self._tell(e.to, e.msg)
        elif isinstance(e, fx.Cut):
            if self._cutting is not None:
                self._cutting.cancel()
            self._cutting = self._spawn(self._cut(e))
        elif isinstance(e, fx.Pass):
            self._pass(e.who, e.msg)
        elif isinstance(e, fx.Serve):
            head = self.links.get(e.order[0])
            self.forwarder = None if head is None else Forwarder("host", head.send)
            if self.api is not None and self.forwarder is not None:
                s = self.machine.settings
                self.api.context = ModelContext(s.context, s.concurrency, self.info.context_length or None)
                self.api.chat = self.forwarder.chat
        elif isinstance(e, fx.Announce):
            await self._send_roster(list(e.order))
            self.copies.offer(list(e.order), self.machine.peers)
        elif isinstance(e, fx.Stop):
            if self.forwarder is not None:
                self.forwarder.fail_all(e.reason, lost=e.lost)
            if self.api is not None:
                self.api.chat = None
            for task in list(self._sending):  # chunks of this epoch's stages must not reach the next epoch
                task.cancel()
            self.copies.halt()
        elif isinstance(e, fx.Close):
            self.copies.lost(e.who)
            self.stages.pop(e.who, None)
            if (link := self.links.pop(e.who, None)) is not None:
                with contextlib.suppress(KafilaError):
                    await link.close()
        elif isinstance(e, fx.Probe):
            self._spawn(self._probe(e.who))
        elif isinstance(e, fx.Exit):
            assert self._done is not None
            if not self._done.done():
                self._done.set_result(e.status)

    def _pass(self, who: str, msg: messages.Need | messages.ChatEvt | messages.CopyNeed | messages.Copied) -> None:
        if isinstance(msg, messages.Need):
            self._send_chunks(who, msg)
        elif isinstance(msg, messages.ChatEvt):
            if self.forwarder is not None:
                self.forwarder.deliver(msg)
        elif isinstance(msg, messages.CopyNeed):
            if who in self.links:
                self.copies.need(who, self.links[who], msg)
        elif (sha := self.copies.copied(who, msg)) is not None:
            self.door.model_sha256 = self.door.model_sha256 or sha
            if self.machine.serving:  # every member learns the new holder (the next admission's roster says it anyway)
                self._feed(lambda: [fx.Announce(tuple(self.machine.order))])

    async def _probe(self, who: str) -> None:
        """Ping `who` on this coordinator's own link, bounded by the link's idle timeout (a silent peer's end)."""
        bound = self.opts.link_idle_timeout_s
        link = self.links.get(who)
        answered = link is not None and await link.ping(bound)
        why = "its link to the coordinator is down" if link is None or link.closed is not None else \
            f"it did not answer the coordinator's ping within {bound:g} s"
        self._feed(lambda: self.machine.probed(who, answered, why, self._now()))

    # -- stages ----------------------------------------------------------------------------------------
    async def _cut(self, cut: fx.Cut) -> None:
        """Cut every member's stage and assign it, all at once: each member's delivery starts as soon as its
        stage is cut, and the host feeds several members concurrently (one sender each)."""
        assert self._done is not None
        for task in list(self._sending):
            task.cancel()  # a stage of an earlier epoch is no longer wanted
        try:
            await run_stoppable(partial(self.cache.source_hash, self.model))  # once, before the cuts read it at once
            if self.machine.settings.sources and not self._source_offered:  # hashed and checked once a session
                self._source_offered = True
                self._source = await offer_source(self.cache.root, self.model, self.machine.settings.sources,
                                                  self.state.log)
            async with asyncio.TaskGroup() as tg:
                for name in cut.placement.order:
                    tg.create_task(self._cut_one(cut, name))
        except* KafilaError as group:  # the session ends with one error, not a group
            if not self._done.done():
                self._done.set_exception(group.exceptions[0])
        if not self._done.done():
            self._feed(lambda: self.machine.delivered(cut.epoch, self._now()))

    async def _cut_one(self, cut: fx.Cut, name: str) -> None:
        plan, order = cut.placement, list(cut.placement.order)
        start, end = plan.ranges[name]
        # cut and hashed on a worker thread that stops with this task (a SIGTERM mid-cut)
        path = await run_stoppable(partial(self.cache.stage, self.model, StageSpec(start, end, head=name == plan.head)))
        if self.use is not None:
            self.use.add(path)
        manifest = await run_stoppable(partial(manifest_for, path, CHUNK_SIZE))
        peer = self.machine.peers.get(name)
        if peer is None:
            return
        self.stages[name] = StageOut(cut.epoch, path, manifest)
        self.state.delivery[name] = (0, manifest.size)
        cut_local = claimed_hash(peer.measurements) is not None  # admitted, so it is the host's model
        if cut_local:
            self.state.log(f"{name} holds the model (same sha256): it cuts its stage itself")
        fingerprints = self._fingerprints(order)
        ranges = {n: (r[0], r[1]) for n, r in plan.ranges.items()}
        assign = messages.Assign(
            epoch=cut.epoch, order=tuple(order), head=order[0], ranges=ranges, settings=self.machine.settings,
            plan=self.state.plan or {}, model=self._label(), stage=manifest, cut_local=cut_local,
            fingerprints=fingerprints, source=None if cut_local or name == self.beside else self._source)
        self._feed(lambda: [fx.Send(name, assign)])

    def _send_chunks(self, who: str, need: messages.Need) -> None:
        out, link = self.stages.get(who), self.links.get(who)
        if out is None or out.epoch != need.epoch or link is None:
            return
        # each chunk of the stage once an epoch, whatever a member asks (repeated or past-the-end indices
        # made the host send its stage again and again)
        chunks = sorted({i for i in need.chunks if i < len(out.manifest.chunks)} - out.asked)
        out.asked.update(chunks)
        task = asyncio.get_running_loop().create_task(self._send_stage(who, link, out, chunks))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_stage(self, name: str, link: Link, out: StageOut, chunks: list[int]) -> None:
        total = out.manifest.size
        done = total - len(chunks) * out.manifest.chunk_size

        def progress(n: int) -> None:
            nonlocal done
            done += n
            self.machine.progress(name, self._now())
            self.state.delivery[name] = (min(max(done, 0), total), total)
            self.state.changed()

        try:
            sent_bytes = await send_stage(link, out.path, out.manifest, chunks, progress)
        except NetworkError as exc:  # the member is gone: a loss like any other, the epoch re-plans
            log.info("stopped sending %s its stage: %s", name, exc)
            self._feed(partial(self._link_down, name, link, str(exc)))
            return
        self.state.delivery[name] = (total, total)
        self.state.log(f"stage delivered to {name}: {sent_bytes} bytes sent")

    # -- the roster ------------------------------------------------------------------------------------
    async def _send_roster(self, order: list[str]) -> None:
        """Who serves and what each measured, as the planner saw them, to every ring member still here."""
        peers = self.machine.peers
        order = [n for n in order if n in peers]
        measured = {}
        for n in order:
            m = planner_member(peers[n])
            measured[n] = messages.Measured(m.bandwidth, m.dispatch_s, m.memory, m.unembed_bandwidth or m.bandwidth,
                                            m.nat.value, peers[n].rtt_ms)
        holders, fingerprints = self.copies.holders(order, peers), self._fingerprints(order)
        roster = messages.Roster(self.state.me or "host", self._label(), measured, self.beside, holders,
                                 self.door.model_sha256, fingerprints,
                                 self._mandates({n: fingerprints[n] for n in holders if n in fingerprints}))
        for n in order:
            await self._tell(n, roster)

    def _mandates(self, successors: dict[str, str]) -> dict[str, dict[str, Any]]:
        """The credential each possible successor (name → its fingerprint) would announce as the coordinator,
        signed by this one, so that members joining later find it (kafila.net.mandate)."""
        code = self.ep.code
        if self.credential is None or code is None:
            return {}
        delegated = {n: self.credential.delegate(self.ep.identity.key, code.session_id, bytes.fromhex(fp))
                     for n, fp in successors.items()}
        return {n: c.as_json() for n, c in delegated.items() if c is not None}

    def _label(self) -> str:
        """The model's name members show (a copy taken over is named by its hash: its roster's name goes on)."""
        return self.opts.label or model_label(self.model)

    def _fingerprints(self, order: list[str]) -> dict[str, str]:
        """Each member's certificate fingerprint, as admitted: edges and the heir are found by it, not by name."""
        return {n: self.machine.peers[n].fingerprint.hex() for n in order if n in self.machine.peers}


def coordinator_announcement(credential: Credential | None) -> dict[str, Any]:
    """What a coordinator's endpoint announces (the host's, or a member's that took coordination over), with the
    credential that shows members it coordinates (kafila.net.mandate; None: it can show none)."""
    found = {} if credential is None else {CREDENTIAL_KEY: credential.as_json()}
    return {"role": "host", "build": build_tag(build_identity()), **found}


def relay_events(source: SessionState, into: SessionState, prefix: str) -> None:
    """Show every event of `source` (a coordinator or member beside the main one) in `into`'s log."""
    shown = 0

    def relay(s: SessionState) -> None:
        nonlocal shown
        for _, text in s.events[shown:]:
            into.log(f"{prefix}{text}")
        shown = len(s.events)

    source.subscribe(relay)

"""A member's part in setting up an epoch: its stage (received from the host, or cut from its own copy of
the model), verified and loaded into llama.cpp, then its two ring edges opened.

Each step the host cannot watch is announced by a heartbeat, so that the host bounds its wait by progress.
A part of the member (runtime.py composes it): it is handed what it needs, and returns the stage's worker and
the ring's edges; it never reaches into the member's other parts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from kafila.engine.stage import ContextConfig, StageEngine
from kafila.errors import DiskFullError, EngineError, KafilaError, ProtocolError, SessionError
from kafila.model.cut import StageSpec
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint, RingEdges
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.delivery.local_model import cut_locally
from kafila.session.delivery.model_chunks import ChunkStore
from kafila.session.delivery.stage_fetch import stage_from_urls
from kafila.session.delivery.stage_files import StageReceiver
from kafila.session.delivery.transfer import Superseded, receive_stage
from kafila.session.emulation import Throttle
from kafila.session.member.heartbeat import working
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.ring.compute_turn import ComputeTurn
from kafila.session.ring.stage_runtime import StageWorker
from kafila.session.state import SessionState, StageStats
from kafila.session.stoppable import run_stoppable

RECV_TIMEOUT_S = 60.0
Send = Callable[[messages.Control], Awaitable[None]]


def stage_config(assign: messages.Assign, threads: int) -> ContextConfig:
    """The host's context settings for every stage, with this machine's own thread count."""
    c = assign.config  # from the session's settings: each a positive int (validated by decode)
    return ContextConfig(n_ctx_per_seq=c["n_ctx_per_seq"], n_seq_max=c["n_seq_max"], n_batch=c["n_batch"],
                         n_threads=threads)


class Stages:
    """Setting up an epoch: the stage, loaded, and the ring edges. `send_host`: to the coordinator."""

    def __init__(self, ep: PeerEndpoint, opts: MemberOptions, state: SessionState, cache: StageCache,
                 use: InUse | None, throttle: Throttle, send_host: Send) -> None:
        self.ep, self.opts, self.state, self.cache, self.use = ep, opts, state, cache, use
        self.throttle, self.send_host = throttle, send_host

    async def setup(self, msg: messages.Assign, control: Link, pending: list[messages.Control]) -> StageWorker | None:
        """This member's stage of `msg`, loaded (None: the host gave the epoch up meanwhile). The stage arrives on
        `control`; the host's messages that come with it go to `pending`."""
        me = self.opts.name
        if me not in msg.ranges:
            raise ProtocolError(f"the host's assignment has no block range for this member ({me})")
        self.state.plan, self.state.circuit_gap_s = msg.plan, None  # the old ring's gap is not this one's
        self.state.model = msg.model
        self.state.stages = {n: StageStats(s) for n, s in msg.stage_seconds.items()}
        start, end = msg.ranges[me]
        is_head = msg.head == me
        self.state.set_phase("delivering", f"assigned blocks [{start}, {end}){' as the head' if is_head else ''}")
        try:
            spec = StageSpec(start, end, head=is_head)
            path = await (self.cut_stage(msg, spec) if msg.cut_local
                          else self.fetch_stage(msg, spec, control, pending) if msg.source is not None
                          else self.receive_stage(msg, control, pending))
        except Superseded:  # the host gave this epoch up (a member lost, a newer plan) before the stage came
            self.state.log(f"epoch {msg.epoch}'s stage is no longer wanted: the host planned again")
            return None
        except DiskFullError as exc:  # the host plans again without this member
            with contextlib.suppress(KafilaError):
                await self.send_host(messages.Lost(me, str(exc), msg.epoch))
            raise SessionError(f"{me} left the session: {exc}") from None
        if self.use is not None:
            self.use.add(path)
        config = stage_config(msg, self.opts.threads)
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
        worker = StageWorker(engine, self.throttle, ComputeTurn(self.cache.root))
        await self.send_host(messages.Loaded(msg.epoch))
        self.state.update_member(me, status="loaded")
        return worker

    async def connect(self, assign: messages.Assign) -> RingEdges | None:
        """Open this member's two ring edges (when the host says every stage is loaded); None: one failed, and
        the host was told."""
        self.state.set_phase("connecting", "opening ring edges")
        async with working(self.send_host, assign.epoch, "opening its ring edges"):
            return await self._open_edges(assign)

    async def _open_edges(self, assign: messages.Assign) -> RingEdges | None:
        # each ring member by the certificate the coordinator admitted: not whoever announced its name later
        # (a restarted member, or one holding the code and posing as it); members only, as a host's
        # coordinating endpoint may share its machine's name with the member beside it
        order, admitted = assign.order, assign.fingerprints
        by_name: dict[str, VerifiedMember] = {}
        for vm in (await self.ep.members()).verified:
            if vm.measurements.get("role") != "host" and admitted.get(vm.name) == vm.fingerprint.hex():
                by_name[vm.name] = vm
        missing = [n for n in order if n not in by_name]
        if missing:
            raise SessionError(f"ring members {missing} are not in the verified member list")
        me = order.index(self.opts.name)
        succ, pred = order[(me + 1) % len(order)], order[me - 1]
        try:
            edges = await self.ep.open_ring([by_name[n] for n in order])
        except KafilaError as exc:  # a neighbour gone before admission: the host's to handle, not an exit
            await self._report_edge_failure(assign, None, pred, str(exc))
            return None
        r = edges.report
        if len(order) > 1 and edges.next is None:
            await self._report_edge_failure(assign, edges, succ, r.error if r is not None and r.error else "no link")
            return None
        edge = None if r is None else messages.EdgeOutcome(r.predicted, r.actual, r.ready_ms, r.error, r.rtt_ms)
        await self.send_host(messages.Ready(assign.epoch, edge))
        self.state.update_member(self.opts.name, status="ready")
        return edges

    async def cut_stage(self, msg: messages.Assign, spec: StageSpec) -> Path:
        """This member's stage cut from its own copy of the model (the host checked the whole file's sha256)."""
        if self.opts.model is None:
            raise ProtocolError("the host asked this member to cut its stage, but it was given no --model")
        self.state.log(f"cutting blocks [{spec.start}, {spec.end}) from {self.opts.model}")
        async with working(self.send_host, msg.epoch, "cutting its stage"):
            path = await run_stoppable(partial(cut_locally, self.cache, self.opts.model, spec, msg.stage))
        await self.send_host(messages.Need(msg.epoch, ()))  # nothing to send: the host counts 0 bytes
        self.state.delivery[self.opts.name] = (msg.stage.size, msg.stage.size)
        self.state.log(f"stage {msg.stage.sha256[:12]} cut locally and verified ({msg.stage.size / 1e6:.1f} MB)")
        return path

    async def fetch_stage(self, msg: messages.Assign, spec: StageSpec, control: Link,
                          pending: list[messages.Control]) -> Path:
        """The stage cut from the model's chunks fetched from the assignment's public URLs, each chunk checked
        against the host's manifest; received from the host instead when the URLs cannot bring them all."""
        assert msg.source is not None
        me, source = self.opts.name, msg.source
        dest = self.cache.root / "delivered" / f"{msg.stage.sha256}.gguf"
        if not dest.is_file():
            store = ChunkStore(self.cache.root / "models", source.manifest)
            if self.use is not None:
                for path in store.files:
                    self.use.add(path)
            held = store.bytes_held()

            def step() -> str | None:  # the host sees none of these bytes: say when they move
                nonlocal held
                now = store.bytes_held()
                moved, held = now != held, now
                self.state.delivery[me] = (min(held, msg.stage.size), msg.stage.size)
                return "fetching its stage from a public URL" if moved else None

            self.state.log(f"fetching the model's chunks for blocks [{spec.start}, {spec.end}) from "
                           f"{', '.join(source.urls)}")
            try:
                async with working(self.send_host, msg.epoch, step, held=lambda: held):
                    await stage_from_urls(store, spec, source.urls, dest, msg.stage, tell=self.state.log,
                                          downlink=self.opts.link_rate.downlink() if self.opts.link_rate else None)
            except SessionError as exc:  # the URLs cannot bring it all: the host sends what is still missing
                self.state.log(f"{exc}; the stage comes from the host instead")
                return await self.receive_stage(msg, control, pending)
        await self.send_host(messages.Need(msg.epoch, ()))  # nothing to send: the host counts 0 bytes
        self.state.delivery[me] = (msg.stage.size, msg.stage.size)
        self.state.log(f"stage {msg.stage.sha256[:12]} cut from the model's verified chunks "
                       f"({msg.stage.size / 1e6:.1f} MB)")
        return dest

    async def _report_edge_failure(self, assign: messages.Assign, edges: RingEdges | None, peer: str,
                                   reason: str) -> None:
        """Tell the host that a ring edge to `peer` could not open; it plans again (or ends the session)."""
        if edges is not None:
            for link in (edges.next, edges.prev):
                if link is not None:
                    await link.close()
        self.state.log(f"ring edge to {peer} failed: {reason}; waiting for the host")
        await self.send_host(messages.Lost(peer, f"its ring edge could not open: {reason}", assign.epoch))

    async def receive_stage(self, assign: messages.Assign, control: Link, pending: list[messages.Control]) -> Path:
        """The stage file, received and verified; raises Superseded when the host gives the epoch up meanwhile."""
        me, manifest = self.opts.name, assign.stage
        receiver = StageReceiver(self.cache.root / "delivered", manifest)
        if self.use is not None:  # from its first byte: a session starting meanwhile (its cache cap) leaves it
            for path in (receiver.part, receiver.final):
                self.use.add(path)
        missing = await run_stoppable(receiver.missing)
        receiver.check_space()  # before asking for anything: a full disk is said at once, not after minutes
        await self.send_host(messages.Need(assign.epoch, tuple(missing)))
        total = manifest.size
        self.state.log(f"asking the host for {receiver.bytes_missing / 1e6:.1f} MB of stage {manifest.sha256[:12]}")
        self.state.delivery[me] = (total - receiver.bytes_missing, total)
        self.state.changed()

        def progress(have: int) -> None:
            self.state.delivery[me] = (min(have * manifest.chunk_size, total), total)
            self.state.changed()

        def aside(raw: bytes) -> None:
            if messages.kind(raw) == "copy":  # a model copy's chunk: its batch is asked again after admission
                return
            msg = messages.decode(raw)
            pending.append(msg)  # handled after the transfer, or at once: the host gave this epoch up
            if isinstance(msg, messages.Lost | messages.Replan | messages.Assign | messages.Reject | messages.Bye):
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

        async with working(self.send_host, assign.epoch, step):
            path = await receive_stage(control, receiver, RECV_TIMEOUT_S, aside, progress)
        self.state.delivery[me] = (total, total)
        self.state.log(f"stage {manifest.sha256[:12]} verified ({total / 1e6:.1f} MB)")
        return path

"""A member connected to its coordinator: an asyncio shell that pumps the member's machine (machine.py).

Each message on the coordinator's link goes to the machine (`Follower.handle`), which checks who may send it
and says what it asks; the shell carries that out with the member's parts, each owning its state: the stage
(stage.py), the ring it serves (serving.py), a model copy (model_copy.py). When the coordinator's link fails
the machine says whom to follow (`without_coordinator`), and the shell connects to it, or coordinates itself
(takeover.py). One code path whether the member is the head or not, and wherever the ring runs.

    coordinator link ─► _next_control ─► Follower.handle(sender, msg) ─► effects ─► _apply ─► the parts
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from kafila.errors import KafilaError, NetworkError, SessionError
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.session.api.server import ApiServer
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.delivery.local_model import model_proof
from kafila.session.delivery.model_copy_receiver import ModelCopy
from kafila.session.emulation import Throttle
from kafila.session.member import machine as mx
from kafila.session.member.host_link import find_host
from kafila.session.member.machine import Follower, log
from kafila.session.member.serving import RingService
from kafila.session.member.stage import Stages
from kafila.session.member.takeover import END_GRACE_S, FIND_COORDINATOR_S, coordinate, survivors
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.state import SessionState


class MemberRuntime:
    """Everything a member does after it is connected to the host."""

    def __init__(self, ep: PeerEndpoint, control: Link, state: SessionState, opts: MemberOptions,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None) -> None:
        self.ep, self.control, self.state, self.opts, self.cache, self.api = ep, control, state, opts, cache, api
        self.use = use  # the delivered stage this member serves: `kafila cache --prune` leaves it
        self.throttle = Throttle(opts.throttle_schedule or ((0.0, opts.throttle),))  # EMULATION
        self.follower = Follower(opts.name, state)
        self.stages = Stages(ep, opts, state, cache, use, self.throttle, self.send_host)
        self.ring = RingService(opts, state, api, self.send_host)
        self.copy = ModelCopy(opts.name, state, cache, use, self.send_host, self._spawn,
                              opts.link_rate.downlink() if opts.link_rate else None)
        self._tg: asyncio.TaskGroup | None = None  # the running member's tasks: a serving task's error ends it
        self._pending: list[messages.Control] = []  # the coordinator's messages read while a stage arrived
        self._gone: set[bytes] = set()  # coordinators lost so far (their endpoints' member ids)
        self._coordinating: asyncio.Task[None] | None = None  # this process coordinates the session (a takeover)

    async def send_host(self, msg: messages.Control) -> None:
        """Send a control message to the coordinator."""
        await self.control.send(messages.encode(msg))

    def _spawn(self, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        assert self._tg is not None
        return self._tg.create_task(job)

    async def run(self) -> int:
        """Follow the host's instructions until it says bye; returns the exit status."""
        async with asyncio.TaskGroup() as self._tg:
            try:
                while True:
                    try:
                        msg = await self._next_control()
                    except NetworkError as exc:  # the host is gone: the ring may well serve on without it
                        status = await self._without_coordinator(str(exc))
                        if status is not None:
                            return status
                        continue  # connected to the member that coordinates now
                    for effect in self.follower.handle(self.control.peer.name, msg):
                        status = await self._apply(effect)
                        if status is not None:
                            return status
            finally:
                await self.ring.stop("this member is leaving")
                if self._coordinating is not None:  # the coordinator lives and ends with this process's member
                    self._coordinating.cancel()
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _next_control(self) -> messages.Control:
        if self._pending:
            return self._pending.pop(0)
        while True:
            raw = await self.control.recv()
            kind = messages.kind(raw)
            if kind == "control":
                return messages.decode(raw)
            if kind == "copy":
                await self.copy.chunk(raw)
                continue
            log.warning("ignored a stray %s message from the host", kind)

    async def _apply(self, e: mx.Effect) -> int | None:
        """Carry out one of the machine's effects; an exit status ends the session."""
        if isinstance(e, messages.Assign):
            await self.ring.stop(None)
            await self._setup(e)
        elif isinstance(e, messages.Connect):
            assign = self.follower.assignment
            if assign is None:
                raise SessionError("the host sent a ring instruction before assigning a stage")
            self.ring.edges = await self.stages.connect(assign)
        elif isinstance(e, messages.Admit):
            self.throttle.start()
            self.ring.start(self._spawn)
            self.state.lost = None  # an earlier loss is behind us: this ring serves
            self.state.set_phase("admitted", "admitted: serving")
        elif isinstance(e, mx.Stop):
            await self.ring.stop(e.reason, lost=e.lost)
        elif isinstance(e, messages.Chat):
            await self.ring.chat(e, self.control.peer.name, self.control.post, self.control.send)
        elif isinstance(e, messages.Prove):
            if self.opts.model is not None:  # the coordinator reads pieces of the file we announced too
                digest = await asyncio.to_thread(model_proof, self.opts.model, bytes.fromhex(e.nonce))
                await self.send_host(messages.Proof(digest))
        elif isinstance(e, messages.Copy):
            assign = self.follower.assignment
            self.copy.offer(e.manifest, None if assign is None else assign.source)
        elif isinstance(e, mx.End):
            return e.status
        return None

    async def _setup(self, assign: messages.Assign) -> None:
        """Receive (or cut) and load this member's stage of `assign`: the worker the ring will serve with."""
        self.follower.assignment = self.ring.assigned = assign
        self.ring.worker = await self.stages.setup(assign, self.control, self._pending)
        if self.ring.worker is not None:
            await self.ring.prepare()

    # -- the coordinator gone (takeover.py) ------------------------------------------------------------
    async def _without_coordinator(self, reason: str) -> int | None:
        """Go on after the coordinator left: None once connected to a member that took coordination over."""
        self.follower.ended = self.ring.ended
        step = self.follower.without_coordinator(reason, self.ring.serving)
        if isinstance(step, mx.Follow):
            await self._follow(step)
            return None
        why = step.why if isinstance(step, mx.End) else ""
        if isinstance(step, mx.ServeOn):
            assert self.ring.task is not None
            await asyncio.wait({self.ring.task})  # until the ring itself breaks (our own cancellation still ends us)
            self.follower.ended = self.ring.ended
            why = self.follower.why_ended(step.left, served=True)
        self.state.lost = why
        self.state.set_phase("closed", f"the session cannot go on: {why}")
        self.ring.fail_requests(why, resumable=False)
        self.ring.say_bye_on_ring(why)
        await asyncio.sleep(END_GRACE_S)  # let every client waiting on this process read the reason
        raise SessionError(why)

    async def _follow(self, step: mx.Follow) -> None:
        """Leave the lost coordinator for `step.heir` (this member, maybe), which re-plans over the survivors
        (or, `adopt`, takes the serving ring over as it is); start coordinating first when it is this member."""
        roster, assignment = self.follower.roster, self.follower.assignment
        assert roster is not None and assignment is not None
        doing = "this member takes" if step.heir == self.opts.name else f"{step.heir} takes"
        if step.adopt:  # a coordinate-only host: the ring is whole, and serves on
            self.state.log(f"{step.left}; the ring serves on, and {doing} coordination over (it holds the model, "
                           f"so it can re-plan after a later loss)")
        else:  # the ring lost a stage with its coordinator
            self.state.set_phase("lost", f"{step.left}; {doing} coordination over (it holds the model) and re-plans "
                                         f"over {', '.join(survivors(roster, assignment.order))}")
            # resumable: the API servers wait; the stage lost with the coordinator is named (it may be the head)
            await self.ring.stop(f"{step.left}; re-planning over the survivors", lost=roster.beside)
        self._gone.add(self.control.peer.member_id)
        with contextlib.suppress(KafilaError):
            await self.control.close()
        if step.heir == self.opts.name:
            self._coordinating = self._spawn(self._coordinate(assignment, roster, step.adopt))
        admitted = roster.fingerprints.get(step.heir)
        found = await find_host(self.ep, FIND_COORDINATOR_S, frozenset(self._gone), step.heir,
                                bytes.fromhex(admitted) if admitted else None)
        self.control = await self.ep.connect(found)
        self._pending.clear()  # the lost coordinator's instructions are void
        self.state.log(f"connected to {step.heir}, which coordinates now")

    async def _coordinate(self, assign: messages.Assign, roster: messages.Roster, adopt: bool) -> None:
        """This process coordinates the session now; its failure is the members' loss of a coordinator, not ours."""
        try:
            model = self.opts.model or self.copy.model_copy
            if model is None:  # the roster names this member a holder: it has one or the other
                raise SessionError("this member has no model file to coordinate with")
            status = await coordinate(self.opts, model, assign, roster, self.state, self.cache, self.use, adopt,
                                      self.ep.identity)
            self.state.log(f"coordination ended (status {status})")
        except KafilaError as exc:
            self.state.log(f"coordination failed: {exc}")

"""Members arriving at the coordinator: each is admitted to the session or refused (another llama.cpp build,
another model file, a name taken), and the coordinator waits until enough have come.

A member connects before it measures its machine (minutes on a fresh one): it is shown measuring, with its
progress, and judged once its measurements come. `--wait` bounds the wait for members to arrive; one that
arrived is waited for while it measures, up to `--measure-wait`, then planned without (and held, if it ends).

A member that comes after the first plan (a friend arriving late, or a lost member's restarted machine) is
held: the coordinator's machine plans it in when that cuts the slowest stage enough, then or at any later plan
(machine.py). The door only talks to arrivals: it hands each member it admits to `enter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from kafila.errors import KafilaError, NetworkError, ProtocolError, SessionError
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.session.coordinator.builds import BuildVerdict, judge_member
from kafila.session.coordinator.planning import GAIN, unusable_measurements
from kafila.session.delivery.local_model import MODEL_KEY, judge_model, model_proof
from kafila.session.options import HostOptions
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, Via, refusal
from kafila.session.state import SessionState, member_view
from kafila.session.stoppable import run_stoppable

log = logging.getLogger("kafila.host")
PROOF_TIMEOUT_S = 10.0  # a member that does not answer its model proof by then is refused


@dataclass
class Arrival:
    """A member connected and measuring its machine: not admitted until its measurements come."""

    link: Link
    since: float  # loop time its arrival, or the wait for or the start of its own measurement, was heard
    step: str = "measuring its machine"
    attempt: int = 0  # the probe's decode timing attempt (0 before it)
    waiting: bool = False  # for another Kafila process's measurement on its machine

    def text(self, elapsed_s: float) -> str:
        """How its measurement goes, for a person."""
        return f"{self.step}, {elapsed_s:.0f} s so far"


class Admission:
    """The coordinator's door: who joins the session, and waiting for them. `present`: the members admitted;
    `enter(peer, link, verdict)`: one more (the runtime hands it to the machine)."""

    def __init__(self, ep: PeerEndpoint, opts: HostOptions, state: SessionState, model: Path, cache: StageCache,
                 my_build: str, present: Callable[[], Collection[str]],
                 enter: Callable[[VerifiedMember, Link, BuildVerdict], None]) -> None:
        self.ep, self.opts, self.state, self.model, self.cache = ep, opts, state, model, cache
        self.settings, self.my_build, self.present, self.enter = opts.settings, my_build, present, enter
        self.measuring: dict[str, Arrival] = {}  # connected, not measured yet (_measured)
        self.model_sha256: str | None = None  # hashed when a member first announces its own copy
        self.arrived = asyncio.Event()
        self.departed: set[str] = set()  # lost so far (the machine's): one that comes back rejoined

    async def _model_refusal(self, peer: VerifiedMember, link: Link) -> str | None:
        """Why a member's own model file (join --model) is refused: None when it has none, or it is the host's
        and the member proves it holds it (a holder cuts its own stages and can become the heir)."""
        if MODEL_KEY not in peer.measurements:
            return None
        if self.model_sha256 is None:
            self.model_sha256 = await run_stoppable(partial(self.cache.source_hash, self.model))
        refusal = judge_model(self.model_sha256, peer.name, peer.measurements)
        if refusal is not None:
            return refusal
        nonce = secrets.token_bytes(32)
        expected = asyncio.create_task(asyncio.to_thread(model_proof, self.model, nonce))
        why = "its proof does not match the host's file"
        try:
            await link.send(messages.encode(messages.Prove(nonce.hex())))
            answer = messages.decode(await link.recv(timeout=PROOF_TIMEOUT_S))
            if isinstance(answer, messages.Proof) and hmac.compare_digest(answer.digest, await expected):
                return None
        except (KafilaError, TimeoutError) as exc:
            why = str(exc)[:120]
        finally:
            expected.cancel()
        return (f"{peer.name} announced the host's model hash but did not prove it holds the file (pieces of it "
                f"the host chose): {why}")

    async def accept_loop(self) -> None:
        async with asyncio.TaskGroup() as tg:
            while True:
                try:
                    link = await self.ep.accept(timeout_s=3600)
                except TimeoutError:
                    continue
                tg.create_task(self._arrive(link))  # each on its own: one member's minutes of measuring hold no other

    async def _arrive(self, link: Link) -> None:
        """A member has connected: refuse it, or (once its measurements came, when it announced MEASURING_KEY)
        admit it. It counts as measuring until it is admitted or refused (a model proof takes a while)."""
        peer = link.peer
        verdict = judge_member(self.my_build, peer.measurements, self.settings.mixed_builds)
        if not verdict.admitted:  # another build or protocol: said at once, before it spends minutes measuring
            await self._refuse(peer, link, verdict.reason)
            return
        if peer.name in self.present() or peer.name in self.measuring:
            await self._refuse(peer, link, "a member of that name is already in the session (join with another --name)",
                               shown=False)
            return
        if not peer.measurements.get(messages.MEASURING_KEY):  # measured before it came (a survivor of a takeover)
            await self._admit(peer, link, verdict)
            return
        self.measuring[peer.name] = Arrival(link, asyncio.get_running_loop().time())
        try:
            measured = await self._measured(peer, link)
            if measured is not None:
                verdict = judge_member(self.my_build, measured.measurements, self.settings.mixed_builds)
                await self._admit(measured, link, verdict, status="measured")
        finally:
            self.measuring.pop(peer.name, None)
            self.arrived.set()

    async def _admit(self, peer: VerifiedMember, link: Link, verdict: BuildVerdict, status: str = "joined") -> None:
        """Admit a member with its measurements, or refuse it (unusable numbers, a model file it cannot prove)."""
        refusal = verdict.reason if not verdict.admitted else \
            unusable_measurements(peer) or await self._model_refusal(peer, link)
        if refusal is not None:
            await self._refuse(peer, link, refusal)
            return
        if peer.name in self.present():
            await self._refuse(peer, link, "a member of that name is already in the session (join with another --name)",
                               shown=False)
            return
        view = replace(member_view(peer), status=status)  # "measured": until its stage is loaded (the Members tab)
        came = "rejoined" if peer.name in self.departed else "joined"
        if self.state.plan is None:
            self.state.log(f"{peer.name} {came} ({len(self.present()) + 1}/{self.expected})")
        else:  # after the first plan: held until a plan takes it in
            view.note = f"{came} after planning: planned in when that cuts the slowest stage"
            self.state.log(f"{peer.name} {came} the session; planned in when that cuts the slowest stage by "
                           f"{GAIN:.0%}, now or at a later plan")
        self.state.upsert_member(view)
        self.enter(peer, link, verdict)
        self.arrived.set()

    async def _refuse(self, peer: VerifiedMember, link: Link, reason: str, shown: bool = True) -> None:
        if shown:
            self.state.upsert_member(replace(member_view(peer), status="refused", note=reason))
            self.state.log(f"refused {peer.name}: {reason}")
        with contextlib.suppress(KafilaError):
            await link.send(messages.encode(messages.Refused(reason)))

    async def _measured(self, peer: VerifiedMember, link: Link) -> VerifiedMember | None:
        """`peer` with the measurements it sends once it has measured its machine; None if it is lost first.

        Meanwhile it is shown measuring, with its step and attempt; the wait for members waits for it."""
        name, arriving = peer.name, self.measuring[peer.name]
        self.state.upsert_member(replace(member_view(peer), status="measuring", note="measuring its machine"))
        self.state.log(f"{name} arrived ({len(self.present()) + len(self.measuring)}/{self.expected}); "
                       "it is measuring its machine")
        self.arrived.set()
        try:
            while True:
                msg = messages.decode(await link.recv())
                refused = refusal(Sender(name, Via.ARRIVAL), msg, RingView())
                if refused is not None:  # never handled (protocol.authority)
                    log.warning("refused %s", refused)
                    continue
                if isinstance(msg, messages.MeasuredSelf):
                    took = asyncio.get_running_loop().time() - arriving.since
                    self.state.log(f"{name} measured its machine in {took:.0f} s")
                    return replace(peer, measurements=msg.measurements)
                if isinstance(msg, messages.Bye):
                    raise NetworkError(msg.reason)
                if isinstance(msg, messages.Measuring):
                    self._on_measuring(name, arriving, msg)
        except (NetworkError, ProtocolError) as exc:
            self.state.update_member(name, status="lost", note=f"lost while measuring: {exc}")
            self.state.log(f"{name} was lost while measuring its machine: {exc}")
            return None

    def _on_measuring(self, name: str, arriving: Arrival, msg: messages.Measuring) -> None:
        if msg.waiting != arriving.waiting:  # its own measurement starts now: the limit counts from here
            arriving.since = asyncio.get_running_loop().time()
        if msg.attempt != arriving.attempt or msg.waiting != arriving.waiting:
            self.state.log(f"{name} is {msg.step}" if msg.waiting else f"{name} is measuring: {msg.step}")
        arriving.step, arriving.attempt, arriving.waiting = msg.step, msg.attempt, msg.waiting
        self.state.update_member(name, status="measuring", note=arriving.text(msg.elapsed_s))

    @property
    def expected(self) -> int:
        """How many members to wait for: those asked for, and the host's own machine unless it only coordinates."""
        return self.opts.members + (0 if self.opts.coordinate_only else 1)

    async def wait_for_members(self) -> None:
        """Until the expected members have joined; or `wait_s` for members to arrive, and `measure_wait_s` for
        each that arrived to measure its machine (from when its own measurement began), whichever is later."""
        loop = asyncio.get_running_loop()
        arrive_by = loop.time() + self.opts.wait_s
        self.state.log(f"waiting up to {self.opts.wait_s:.0f} s for {self.expected} members to arrive (--wait), and "
                       f"up to {self.settings.measure_wait_s:.0f} s for each to measure its machine (--measure-wait)")
        while len(self.present()) < self.expected:
            now = loop.time()
            deadlines = [a.since + self.settings.measure_wait_s for a in self.measuring.values()]
            arriving = now < arrive_by and len(self.present()) + len(self.measuring) < self.expected
            later = [d for d in deadlines if d > now] + ([arrive_by] if arriving else [])
            if not later:
                break
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), min(later) - now)
        for name, a in self.measuring.items():  # each goes on measuring, and is held as a late arrival if it ends
            why = (f"left out: still measuring its machine after {self.settings.measure_wait_s:.0f} s (--measure-wait; "
                   f"{a.step}); planned in later if it finishes and that cuts the slowest stage")
            self.state.update_member(name, note=why)
            self.state.log(f"{name} {why}")
        if not self.present():
            if self.measuring:
                raise SessionError(f"no member finished measuring its machine within {self.settings.measure_wait_s:.0f}"
                                   f" s (--measure-wait): {', '.join(self.measuring)}")
            raise SessionError(f"no member joined within {self.opts.wait_s:.0f} s")

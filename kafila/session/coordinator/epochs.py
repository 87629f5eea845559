"""The coordinator's epochs: plan over the members present, cut and deliver their stages, open the ring's
edges, admit the ring (or reject the session), and watch it serve until a member is lost.

Each loss ends an epoch (losses.LossHandling); the next plans again over the others. A coordinator that took
over a ring serving without it adopts that ring as it is instead of planning its first epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

from kafila.errors import KafilaError, SessionError
from kafila.model.cut import StageSpec
from kafila.model.gguf_file import GGUFFile
from kafila.model.gguf_set import SHARD_NAME
from kafila.net.trust import VerifiedMember
from kafila.planner import Member, ModelSpec, Workload, make_plan, predict_edge
from kafila.planner.placement import Placement
from kafila.session.api.server import Forwarder, ModelContext
from kafila.session.coordinator.drift import Drift, measured_speed
from kafila.session.coordinator.model_copy import ModelCopies
from kafila.session.delivery.local_model import claimed_hash
from kafila.session.delivery.stage_files import manifest_for
from kafila.session.protocol import messages
from kafila.session.protocol.manifest import CHUNK_SIZE
from kafila.session.state import EdgeView, StageStats, expert_rates
from kafila.session.stoppable import run_stoppable

EXIT_REJECTED = 3
GAIN = 0.1  # a drifting member is planned around, a newcomer planned in, when that cuts the slowest stage this much


def cuts_enough(now: float | None, new: float | None) -> bool:
    """Whether a new plan's slowest stage `new` is GAIN or more below `now` (None: no feasible plan)."""
    return now is not None and new is not None and new <= (1 - GAIN) * now


def model_label(model: Path) -> str:
    """The name a user sees for a model: its file's stem (a GGUF's general.name is often a raw slug), without a
    split set's `-00001-of-0000N`; an Ollama blob is named by its digest, so there general.name it is."""
    m = SHARD_NAME.match(model.name)
    if m:
        return m.group("prefix")
    if model.name.startswith("sha256-") and not model.suffix:
        return str(GGUFFile(model).get("general.name", model.name))
    return model.stem


def planner_member(vm: VerifiedMember, slower: float = 1.0) -> Member:
    """The planner's view of a member's verified announcement; `slower`: its calls take that many times
    what its probe measured (seen while serving, drift.py): every time scaled up, every rate down."""
    m = vm.measurements
    try:
        emu = m.get("emu") or {}
        member = Member(vm.name, float(m["bw"]) / slower, float(m["disp"]) * slower, int(m["mem"]),
                      float(vm.rtt_ms or 0.0), vm.nat_class, float(m["ubw"]) / slower,
                      unembed_s=float(m.get("uo", 0.0)) * slower, block_s=float(m.get("blk", 0.0)) * slower,
                      # prefill and the machine: absent from an older member's announcement (no TTFT then)
                      prefill_bandwidth=float(m.get("pbw", 0.0)) / slower,
                      prefill_dispatch_s=float(m.get("pdisp", 0.0)) * slower,
                      prefill_block_s=float(m.get("pblk", 0.0)) * slower, prefill_rows=int(m.get("prow", 0)),
                      prefill_attn_s=float(m.get("patt", 0.0)) * slower,
                      prefill_expert_rates=tuple((kind, rate / slower)
                                                 for kind, rate in sorted(expert_rates(m).items())),
                      # the time it lost is not compute: a throttle, for the planner's machines shared by stages
                      machine=str(m.get("mach", "")), throttle=max(float(emu.get("throttle", 1.0)) * slower, 1.0))
    except (KeyError, TypeError, ValueError):
        raise SessionError(f"member {vm.name} announced no usable measurements") from None
    # JSON carries NaN and infinities: one in a plan's sums makes every comparison false
    bad = [f.name for f in fields(member) if isinstance(v := getattr(member, f.name), int | float)
           and not isinstance(v, bool) and not (math.isfinite(v) and v >= 0)]
    bad += [name for name in ("bandwidth", "unembed_bandwidth", "memory") if not bad and not getattr(member, name)]
    if bad:
        raise SessionError(f"member {vm.name} announced unusable measurements ({', '.join(bad)})")
    return member


class Epochs(ModelCopies):
    """Plan, deliver, admit, watch: one epoch after another until the session ends."""

    async def _epoch(self) -> int | None:
        """Plan and serve once; None to plan again (after a loss), else the exit status."""
        self.epoch += 1
        self._replanning = False
        self.reports.reset()
        names = self._plan_over()
        self.state.set_phase("planning", f"planning over {', '.join(names)}")
        members = [planner_member(self.joined[n].peer, self.speed.get(n, 1.0)) for n in names]
        workload = Workload(self.settings.concurrency, self.settings.context, self.settings.batch)
        plan = make_plan(members, ModelSpec.described(self.info), workload)
        placement = plan.placement(self.settings.strategy)
        if self.state.replans and "bottleneck_s" not in self.state.replans[-1]:  # the plan a drift called for
            now = self.state.replans[-1]["bottleneck_s"] = placement.bottleneck_seconds or 0.0
            self.state.log(f"planned again: slowest stage {now * 1e3:.1f} ms predicted "
                           f"(measured {self.state.replans[-1]['was_bottleneck_s'] * 1e3:.1f} ms before)")
        self.plan = plan
        self.state.plan = plan.to_json(self.settings.strategy)
        self.state.circuit_gap_s = None  # the old ring's: the new one's head reports its own
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
        self.ring = tuple(order)
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
            return await self._on_break(*loss)
        self._record_edges(order)
        self.order = order
        self.forwarder = Forwarder("host", self.joined[order[0]].link.send)
        if self.api is not None:
            self.api.context = ModelContext(self.settings.context, self.settings.concurrency,
                                            self.info.context_length or None)
            self.api.chat = self.forwarder.chat
        for n in order:
            await self._tell(n, messages.Admit(self.epoch))
            self.state.update_member(n, status="serving", note="")  # a late joiner's wait is over
        # the coordinator's state, so that the ring outlives the host (kafila.session.member.takeover)
        await self._send_roster(order)
        self.state.lost = None
        self.state.set_phase("admitted", f"admitted: {len(order)} members, head {placement.head}")
        self._offer_copy()
        return await self._until_change()

    async def _adopt(self, assign: messages.Assign) -> int | None:
        """Coordinate the ring of `assign`, which serves on without its coordinator; None to plan again.

        Nothing is planned, cut or sent: each member keeps its stage and edges, and only its control link
        moves here. A member of the ring that never connected is lost, and the others are planned again.
        """
        self.epoch = assign.epoch  # the members' epoch goes on: their reports name it
        self.reports.reset()
        order = list(assign.order)
        self.ring = tuple(order)
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
        await self._send_roster(order)
        self.state.set_phase("admitted", f"took the serving ring over: {len(order)} members, head {assign.head}")
        return await self._until_change()

    async def _until_change(self) -> int | None:
        """Serve until a member is lost, drifts from its plan so far that a new plan is worth it, or one arrives
        that a new plan is worth taking in; that ends the epoch (None: plan again)."""
        while True:
            loss = asyncio.ensure_future(self._next_break())
            drift = asyncio.ensure_future(self.drifted.get())
            arrival = asyncio.ensure_future(self.arrivals.get())
            try:
                await asyncio.wait({loss, drift, arrival}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for f in (loss, drift, arrival):
                    f.cancel()
            # an item taken here and not acted on is no loss: the next plan, whatever calls for it, has everyone
            if loss.done() and not loss.cancelled():  # a loss first: the plan must do without the member anyway
                return await self._on_break(*loss.result())
            if drift.done() and not drift.cancelled():
                speed = self._budgeted(drift.result())
                if speed is not None and self._worth_planning_again(drift.result(), speed):
                    return await self._on_drift(drift.result(), speed)
            elif arrival.result() in self.held:
                if (gain := self._worth_taking_in(arrival.result())) is not None:
                    return await self._on_arrival(arrival.result(), *gain)

    def _budgeted(self, drift: Drift) -> dict[str, float] | None:
        """The speeds to plan `drift` with, or None when the re-plan budget holds it back (replan_budget.py)."""
        now = asyncio.get_running_loop().time()
        verdict = self.budget.weigh(now, drift, self.speed, self._measured_speed(drift))
        if verdict.note is not None:
            self.state.log(verdict.note)
        if verdict.speed is None:
            self.drift.dismiss(drift.member, now, verdict.quiet_until)
        return verdict.speed

    def _worth_planning_again(self, drift: Drift, speed: dict[str, float]) -> bool:
        """Whether a plan with every member at `speed` (as measured) cuts the slowest stage by GAIN or more
        (a machine loaded as a whole slows every stage alike: moving blocks would not help, and costs KV)."""
        new = self._slowest([n for n in self.order if n in self.joined], speed)
        now = max((drift.measured_s if n == drift.member else s.measured_s or s.predicted_s
                   for n, s in self.state.stages.items()), default=0.0)
        if cuts_enough(now, new):
            return True
        self.drift.dismiss(drift.member, asyncio.get_running_loop().time())
        again = f"{new * 1e3:.1f} ms planned again" if new is not None else "no feasible plan"
        self.state.log(f"{drift.text()}; a new plan would not help (slowest stage {now * 1e3:.1f} ms now, {again})")
        return False

    def _measured_speed(self, drift: Drift) -> dict[str, float]:
        return measured_speed(self.speed, {n: (s.predicted_s, s.measured_s) for n, s in self.state.stages.items()},
                              drift)

    def _slowest(self, names: list[str], speed: dict[str, float] | None = None) -> float | None:
        """The slowest stage of the plan over `names` at their measured speeds (or `speed`); None: no feasible plan."""
        speed = self.speed if speed is None else speed
        workload = Workload(self.settings.concurrency, self.settings.context, self.settings.batch)
        members = [planner_member(self.joined[n].peer, speed.get(n, 1.0)) for n in names]
        placement = make_plan(members, ModelSpec.described(self.info), workload).placement(self.settings.strategy)
        return placement.bottleneck_seconds if placement.feasible else None

    def _plan_over(self) -> list[str]:
        """Who the next plan is over: every member not held, and each held one (in name order) whose joining
        cuts the slowest stage by GAIN or more, or without whom there is no feasible plan."""
        names = sorted(n for n in self.joined if n not in self.held)
        now = self._slowest(names) if names else None
        for n in sorted(self.held):
            new = self._slowest([*names, n])
            if now is None or cuts_enough(now, new):
                names.append(n)
                self.held.discard(n)
                now = new
        return sorted(names)

    def _worth_taking_in(self, name: str) -> tuple[float, float] | None:
        """(slowest stage now, with `name`) when a plan that takes it into the serving ring cuts the slowest
        stage by GAIN or more; None when it does not (it stays held: a later plan may take it)."""
        now, new = self._slowest(self.order), self._slowest([*self.order, name])
        if cuts_enough(now, new):
            assert now is not None and new is not None
            return now, new
        with_it = f"{new * 1e3:.1f} ms" if new is not None else "no feasible plan"
        self.state.log(f"{name} waits: a plan with it would not cut the slowest stage by {GAIN:.0%} "
                       f"({(now or 0.0) * 1e3:.1f} ms now, {with_it} with it)")
        return None

    async def _on_arrival(self, name: str, now: float, new: float) -> int | None:
        """End this epoch to plan the member who arrived while it served in (None: plan again)."""
        self.held.discard(name)
        self.state.replans.append({"member": name, "why": "joined", "was_bottleneck_s": now})
        await self._plan_again(f"{name} joined: slowest stage {now * 1e3:.1f} ms, {new * 1e3:.1f} ms with it")
        return None

    async def _on_drift(self, drift: Drift, speed: dict[str, float]) -> int | None:
        """End this epoch to plan again with every member at `speed`, the one it shows (None: plan again)."""
        slower = {n: f / self.speed.get(n, 1.0) for n, f in speed.items() if f != self.speed.get(n, 1.0)}
        self.speed = speed
        now = asyncio.get_running_loop().time()
        self.drift.planned_again(drift.member, now)
        self.budget.planned(now)
        was = max((s.measured_s or s.predicted_s for s in self.state.stages.values()), default=0.0)
        self.state.replans.append({"member": drift.member, "predicted_s": drift.predicted_s,
                                   "measured_s": drift.measured_s, "was_bottleneck_s": was, "slower": slower})
        await self._plan_again(drift.text())
        return None

    async def _plan_again(self, reason: str) -> None:
        """End this epoch though nobody was lost.

        Requests in flight end as after a loss, resumable: the API servers send them to the new ring, which
        rebuilds them token for token."""
        self._replanning = True
        self.state.set_phase("planning", f"planning again: {reason}")
        if self.forwarder is not None:
            self.forwarder.fail_all(f"the ring is planned again: {reason}")
        if self.api is not None:
            self.api.chat = None
        for name in list(self.joined):
            await self._tell(name, messages.Replan(reason, self.epoch))

    def _roster(self, order: list[str]) -> messages.Roster:
        """Who serves and what each measured, as the planner saw them (replicated to every member)."""
        measured = {}
        for n in order:
            m = planner_member(self.joined[n].peer)
            measured[n] = messages.Measured(m.bandwidth, m.dispatch_s, m.memory, m.unembed_bandwidth or m.bandwidth,
                                            m.nat.value, self.joined[n].peer.rtt_ms)
        holders, fingerprints = self._holders(order), self._fingerprints(order)
        return messages.Roster(self.state.me or "host", self._label(), measured, self.beside, holders,
                               self._model_sha256, fingerprints,
                               self._mandates({n: fingerprints[n] for n in holders if n in fingerprints}))

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
        return {n: self.joined[n].peer.fingerprint.hex() for n in order}

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
        start, end = plan.ranges[name]
        j = self.joined[name]
        # cut and hashed on a worker thread that stops with this task (a SIGTERM mid-cut)
        spec = StageSpec(start, end, head=(name == plan.head))
        j.stage_path = await run_stoppable(partial(self.cache.stage, self.model, spec))
        if self.use is not None:
            self.use.add(j.stage_path)
        j.manifest = await run_stoppable(partial(manifest_for, j.stage_path, CHUNK_SIZE))
        j.asked = set()
        self.state.delivery[name] = (0, j.manifest.size)
        cut_local = claimed_hash(j.peer.measurements) is not None  # admitted, so it is the host's model
        if cut_local:
            self.state.log(f"{name} holds the model (same sha256): it cuts its stage itself")
        await self._tell(name, messages.Assign(
            epoch=self.epoch, order=tuple(order), head=order[0],
            ranges={n: (r[0], r[1]) for n, r in plan.ranges.items()}, settings=self.settings,
            plan=self.state.plan or {}, model=self._label(), stage=j.manifest,
            cut_local=cut_local, fingerprints=self._fingerprints(order)))

    async def _on_break(self, who: str | None, reason: str) -> int | None:
        """End this epoch over `who`'s loss (losses._on_lost), or plan again over everyone (`who` None: a ring
        broke though each of its members answers the coordinator)."""
        if who is not None:
            return await self._on_lost(who, reason)
        await self._plan_again(reason)
        return None

    async def _wait_all(self, order: list[str], kind: str) -> tuple[str | None, str] | None:
        """Until every member of `order` has sent `kind` (None), or a member is lost first: (who, reason); or
        a ring edge broke though both its ends answer (None, reason).

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
        stall = self.settings.stall_s
        lost_wait = asyncio.ensure_future(self._next_break())
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
                self.state.set_edge(a, b, actual, edge.ready_ms, edge.rtt_ms)
                rtt = f", round trip {edge.rtt_ms:.1f} ms" if edge.rtt_ms is not None else ""
                self.state.log(f"edge {a} → {b}: predicted {self.state.predicted[a][b]}, {actual}"
                               f" (usable after {edge.ready_ms} ms{rtt})")

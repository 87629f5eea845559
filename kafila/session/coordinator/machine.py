"""The coordinator as a sans-I/O machine: (authenticated sender, message, now) in, effects out.

It owns the session's epochs: whom each plan is over, the wait for every stage `loaded` and every edge `ready`
(bounded by progress: a member quiet for `stall_s` is lost), the admitted ring, and what ends an epoch: a loss,
a drift worth a new plan, an arrival worth planning in. It composes the machines that own the rest: the loss
reports waiting for the coordinator's own link (loss_reports.py), the drift watch (drift.py), the re-plan
budget (replan_budget.py) and the planner's view (planning.py). It never sends, sleeps or reads a clock:
the shell (runtime.py) feeds it and carries out its effects (effects.py) in order.

    handle(sender, msg, now)  a member's control message; who may send it is checked first (protocol.authority)
    join(peer, now)           a member admitted (before the first plan: planned; after it: held until worth it)
    link_down(who, why, now)  its link failed (a send, a receive, a stage transfer): a loss
    probed(who, ok, why, now) the answer to a Probe (a neighbour's loss report, confirmed or not)
    delivered(epoch, now)     every stage of a Cut is assigned: the wait for `loaded` counts from now
    progress(who, now, step)  stage bytes moving to `who`
    timer(now), next_timer()  the stall limit
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kafila.net.trust import VerifiedMember
from kafila.planner import predict_edge
from kafila.session.coordinator import effects as fx
from kafila.session.coordinator.builds import RingBuilds
from kafila.session.coordinator.drift import Drift, DriftWatch, measured_speed
from kafila.session.coordinator.effects import Effect
from kafila.session.coordinator.loss_reports import Action, Evict, LossReports, Probe
from kafila.session.coordinator.planning import EXIT_REJECTED, GAIN, Planner, cuts_enough
from kafila.session.coordinator.replan_budget import ReplanBudget
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, Via, refusal
from kafila.session.ring.ring_stats import show_stats
from kafila.session.settings import SessionSettings
from kafila.session.state import EdgeView, SessionState, StageStats

log = logging.getLogger("kafila.host")
Authority = Callable[[Sender, messages.Control, RingView], str | None]


class Coordinator:
    """The coordinator's decisions over the members admitted; `state` is the session's, for people."""

    def __init__(self, settings: SessionSettings, state: SessionState, planner: Planner, builds: RingBuilds,
                 departed: Iterable[str] = ()) -> None:
        self.settings, self.state, self.planner, self.builds = settings, state, planner, builds
        self.peers: dict[str, VerifiedMember] = {}  # admitted, as verified (their measurements)
        self.held: set[str] = set()  # came after the first plan: planned in when worth it
        self.arrivals: list[str] = []  # held members not weighed yet (weighed while the ring serves)
        self.departed = set(departed)  # lost so far: one that comes back (restarted) may rejoin
        self.epoch = 0
        self.ring: tuple[str, ...] = ()  # this epoch's ring, from its plan on: who may say what (authority)
        self.order: list[str] = []  # the ring admitted (serving, or the last that served)
        self.replanning = False  # this epoch is over: members' reports of it are stale
        self.cutting = False  # the shell is cutting and assigning stages: no stall counts
        self.waiting: dict[str, float] = {}  # this step's members not answered yet → their last progress
        self.doing: dict[str, str] = {}  # what each was doing then, for a person
        self.readies: dict[str, messages.Ready] = {}
        self.speed: dict[str, float] = {}  # member → its stage time over its probe's, as measured serving
        self.reports = LossReports()  # neighbours' loss reports, confirmed on the coordinator's own link first
        self.drift = DriftWatch()
        self.budget = ReplanBudget()
        self.authority: Authority = refusal

    # -- inputs ------------------------------------------------------------------------------------
    def handle(self, sender: str, msg: messages.Control, now: float) -> list[Effect]:
        """A control message on admitted member `sender`'s link."""
        if sender not in self.peers:
            return []
        if sender in self.waiting:  # any message is a sign of progress
            self.waiting[sender] = now
        refused = self.authority(Sender(sender, Via.MEMBER), msg, RingView(self.ring, frozenset(self.peers)))
        if refused is not None:  # never handled (protocol.authority)
            log.warning("refused %s", refused)
            return []
        handler: Callable[[str, messages.Control, float], list[Effect]] | None = getattr(self, f"_on_{msg.T}", None)
        if handler is None:
            log.warning("ignored a %r message from %s", msg.T, sender)
            return []
        return handler(sender, msg, now)

    def join(self, peer: VerifiedMember, now: float) -> list[Effect]:
        """`peer` is admitted; after the first plan it is held, and weighed while the ring serves."""
        self.peers[peer.name] = peer
        self.departed.discard(peer.name)
        if self.state.plan is None:
            return []
        self.held.add(peer.name)
        self.arrivals.append(peer.name)
        return self._weigh_arrivals(now) if self.serving else []

    def link_down(self, who: str, why: str, now: float) -> list[Effect]:
        return self.lose(who, why, now)

    def probed(self, who: str, answered: bool, why: str, now: float) -> list[Effect]:
        actions = self.reports.answered(who, now) if answered else self.reports.unanswered(who, why)
        return self._act(actions, now)

    def delivered(self, epoch: int, now: float) -> list[Effect]:
        if epoch != self.epoch or not self.cutting:
            return []
        self.cutting = False
        self.waiting = {n: now for n in self.waiting}
        return [] if self.waiting else self._connect(now)

    def progress(self, who: str, now: float, step: str = "receiving its stage") -> None:
        if who in self.waiting:
            self.waiting[who], self.doing[who] = now, step

    def next_timer(self) -> float | None:
        """When a member waited for has been quiet for the stall limit (None: nobody is waited for)."""
        if self.cutting or not self.waiting:
            return None
        return min(self.waiting.values()) + self.settings.stall_s

    def timer(self, now: float) -> list[Effect]:
        when = self.next_timer()
        if when is None or now < when:
            return []
        stalled = min(self.waiting, key=lambda n: self.waiting[n])
        sent = self.state.delivery.get(stalled)
        step = self.doing.get(stalled, "receiving its stage")
        where = f" ({sent[0] / 1e6:.1f} of {sent[1] / 1e6:.1f} MB sent)" \
            if sent is not None and step == "receiving its stage" else ""
        reason = f"made no progress for {self.settings.stall_s:g} s while {step}{where}"
        self.state.log(f"{stalled} {reason}")
        return self.lose(stalled, reason, now)

    @property
    def serving(self) -> bool:
        return self.state.phase == "admitted" and not self.replanning

    # -- epochs ------------------------------------------------------------------------------------
    def start(self, now: float) -> list[Effect]:
        """Plan the next epoch over the members present (not held, and each held one worth planning in)."""
        self.epoch += 1
        self.replanning, self.cutting, self.readies = False, True, {}
        self.reports.reset()
        names = self._plan_over()
        self.state.set_phase("planning", f"planning over {', '.join(names)}")
        plan, placement = self.planner.plan([self.peers[n] for n in names], self.speed)
        replans = self.state.replans
        if replans and "bottleneck_s" not in replans[-1]:  # the plan a drift called for
            slowest = replans[-1]["bottleneck_s"] = placement.bottleneck_seconds or 0.0
            self.state.log(f"planned again: slowest stage {slowest * 1e3:.1f} ms predicted "
                           f"(measured {replans[-1]['was_bottleneck_s'] * 1e3:.1f} ms before)")
        self.state.plan = plan.to_json(self.settings.strategy)
        self.state.circuit_gap_s = None  # the old ring's: the new one's head reports its own
        self.state.plan["builds"] = self.state.builds = self.builds.for_members(names)
        peers = [self.peers[n] for n in names]
        self.state.predicted = {a.name: {b.name: predict_edge(a.nat_class, b.nat_class) for b in peers
                                         if b.name != a.name} for a in peers}
        if not placement.feasible:
            reason = plan.admission.text if plan.admission else str(placement.reason)
            self.state.rejection = reason
            self.state.set_phase("rejected", f"rejected: {reason}")
            self.waiting = {}
            return [*(fx.Send(n, messages.Reject(reason)) for n in self.peers), fx.Exit(EXIT_REJECTED)]
        order = list(placement.order)
        self.ring = tuple(order)
        self.state.edges = [EdgeView(a, b, self.state.predicted[a][b])
                            for a, b in zip(order, order[1:] + order[:1], strict=True) if a != b]
        self.state.stages = {n: StageStats(float(s)) for n, s in self.state.plan["stage_seconds"].items()}
        self.state.set_phase("delivering", f"ring {' → '.join(order)} (head {placement.head}); cutting stages")
        self._await("loaded", order, now)
        return [fx.Cut(self.epoch, placement)]

    def adopt(self, assign: messages.Assign, now: float) -> list[Effect]:
        """Coordinate the ring of `assign`, serving on without its coordinator: nothing planned, cut or sent
        but the roster. A ring member that never connected is lost, and the others are planned again."""
        self.epoch = assign.epoch  # the members' epoch goes on: their reports name it
        self.reports.reset()
        self.ring = tuple(assign.order)
        self.state.plan, self.state.model = assign.plan, assign.model
        self.state.stages = {n: StageStats(float(s)) for n, s in assign.stage_seconds.items()}
        missing = [n for n in assign.order if n not in self.peers]
        if missing:
            return self._end_over(missing, "it did not reach the member that took coordination over", now)
        self.order = list(assign.order)
        for n in self.order:
            self.state.update_member(n, status="serving")
        self.state.set_phase("admitted", f"took the serving ring over: {len(self.order)} members, head {assign.head}")
        return [fx.Announce(tuple(self.order)), *self._weigh_arrivals(now)]

    def _await(self, kind: str, order: list[str], now: float) -> None:
        self.waiting = {n: now for n in order}
        step = "opening its ring edges" if kind == "ready" else "receiving its stage"
        self.doing = dict.fromkeys(order, step)

    def _on_loaded(self, sender: str, msg: messages.Loaded, now: float) -> list[Effect]:
        if msg.epoch != self.epoch or self.state.phase != "delivering" or self.waiting.pop(sender, None) is None:
            return []
        self.state.update_member(sender, status="loaded")
        return [] if self.waiting or self.cutting else self._connect(now)

    def _connect(self, now: float) -> list[Effect]:
        # two steps, so that nobody opens ring edges while a neighbour is still receiving its stage
        self.state.set_phase("connecting", "every stage is loaded; opening the ring's edges")
        self._await("ready", list(self.ring), now)
        return [fx.Send(n, messages.Connect(self.epoch)) for n in self.ring]

    def _on_ready(self, sender: str, msg: messages.Ready, now: float) -> list[Effect]:
        if msg.epoch != self.epoch or self.state.phase != "connecting" or self.waiting.pop(sender, None) is None:
            return []
        self.readies[sender] = msg
        self.state.update_member(sender, status="ready")
        return [] if self.waiting else self._admit(now)

    def _admit(self, now: float) -> list[Effect]:
        order = list(self.ring)
        self._record_edges(order)
        self.order = order
        effects: list[Effect] = [fx.Serve(self.ring), *(fx.Send(n, messages.Admit(self.epoch)) for n in order)]
        for n in order:
            self.state.update_member(n, status="serving", note="")  # a late joiner's wait is over
        self.state.lost = None
        self.state.set_phase("admitted", f"admitted: {len(order)} members, head {order[0]}")
        # the coordinator's state, so that the ring outlives the host (kafila.session.member.takeover)
        return [*effects, fx.Announce(self.ring), *self._weigh_arrivals(now)]

    def _record_edges(self, order: list[str]) -> None:
        """Each member's `ready` reports its outgoing ring edge: predicted against what happened."""
        for a, b in zip(order, order[1:] + order[:1], strict=True):
            edge = self.readies[a].edge if a in self.readies else None
            if a != b and edge is not None:
                actual = {"direct": "direct", "relay": "relayed"}.get(edge.actual, "failed")
                self.state.set_edge(a, b, actual, edge.ready_ms, edge.rtt_ms)
                rtt = f", round trip {edge.rtt_ms:.1f} ms" if edge.rtt_ms is not None else ""
                self.state.log(f"edge {a} → {b}: predicted {self.state.predicted[a][b]}, {actual}"
                               f" (usable after {edge.ready_ms} ms{rtt})")

    def _plan_again(self, reason: str, now: float) -> list[Effect]:
        """End this epoch though nobody was lost: requests in flight end resumable, and everyone plans again."""
        self.replanning = True
        self.state.set_phase("planning", f"planning again: {reason}")
        return [fx.Stop(f"the ring is planned again: {reason}"),
                *(fx.Send(n, messages.Replan(reason, self.epoch)) for n in self.peers), *self.start(now)]

    def _plan_over(self) -> list[str]:
        """Who the next plan is over: every member not held, and each held one (in name order) whose joining
        cuts the slowest stage by GAIN or more, or without whom there is no feasible plan."""
        names = sorted(n for n in self.peers if n not in self.held)
        slowest = self._slowest(names) if names else None
        for n in sorted(self.held):
            new = self._slowest([*names, n])
            if slowest is None or cuts_enough(slowest, new):
                names.append(n)
                self.held.discard(n)
                slowest = new
        return sorted(names)

    def _slowest(self, names: list[str], speed: dict[str, float] | None = None) -> float | None:
        return self.planner.slowest([self.peers[n] for n in names], self.speed if speed is None else speed)

    # -- what members say --------------------------------------------------------------------------
    def _on_need(self, sender: str, msg: messages.Need, now: float) -> list[Effect]:
        return [fx.Pass(sender, msg)] if msg.epoch == self.epoch else []

    def _on_working(self, sender: str, msg: messages.Working, now: float) -> list[Effect]:
        if msg.epoch == self.epoch:  # the message itself was progress; what it says is for people
            self.doing[sender] = msg.step
            if msg.held is not None and sender in self.state.delivery:  # its stage's bytes from a public URL
                total = self.state.delivery[sender][1]
                self.state.delivery[sender] = (min(msg.held, total), total)
                self.state.changed()
        return []

    def _on_chat_evt(self, sender: str, msg: messages.ChatEvt, now: float) -> list[Effect]:
        return [fx.Pass(sender, msg)]

    _on_copy_need = _on_copied = _on_chat_evt

    def _on_lost(self, sender: str, msg: messages.Lost, now: float) -> list[Effect]:
        # Only the member named or its ring neighbours get here (authority). A report of an epoch given up is
        # stale: a member stopped on the coordinator's word closes its edges, and a neighbour still serving
        # reports it lost. A member truly gone is lost on its own link to the coordinator too.
        if msg.epoch != self.epoch or self.replanning:
            log.info("ignored %s's stale report of epoch %d: %s lost (%s)", sender, msg.epoch, msg.who, msg.reason)
            return []
        return self._act(self.reports.report(sender, msg.who, msg.reason), now)

    def _act(self, actions: list[Action], now: float) -> list[Effect]:
        """Carry out what the loss reports' machine says (coordinator.loss_reports)."""
        effects: list[Effect] = []
        for action in actions:
            if isinstance(action, Evict):
                if action.confirmed:
                    self.state.log(f"{action.who} is lost: {action.confirmed}")
                effects += self.lose(action.who, action.reason, now)
            elif isinstance(action, Probe):
                effects.append(action)
            elif not self.replanning:
                self.state.log(action.reason)
                effects += self._plan_again(action.reason, now)
        return effects

    def lose(self, who: str, reason: str, now: float) -> list[Effect]:
        """`who` is lost: a held member just leaves; a planned one ends the epoch, and the others plan again."""
        if who not in self.peers:  # a late report of an earlier loss is no news
            return []
        if self.order and who not in self.order and self.state.phase == "admitted":  # the ring serving lost nothing
            self._drop(who)
            self.state.update_member(who, status="lost", note=reason)
            self.state.log(f"{who}, waiting for the next plan, left: {reason}")
            return [fx.Close(who)]
        return self._end_over([who], reason, now)

    def _end_over(self, lost: list[str], reason: str, now: float) -> list[Effect]:
        """End this epoch over the members `lost`: the others hear of it and plan again (if they may)."""
        self.replanning = True  # this epoch is over: its members' reports from now on are stale
        effects: list[Effect] = []
        for who in lost:
            self.state.lost = f"{who}: {reason}"
            self.state.update_member(who, status="lost", note=reason)
            self.state.set_phase("lost", f"member {who} was lost: {reason}")
            self._drop(who)
            effects += [fx.Stop(f"member {who} was lost: {reason}", who), fx.Close(who),
                        *(fx.Send(n, messages.Lost(who, reason, self.epoch)) for n in self.peers)]
        if not self.settings.replan or not self.peers:
            self.waiting = {}
            return [*effects, fx.Exit(1)]
        self.state.log("planning again over the remaining members")
        return [*effects, *self.start(now)]

    def _drop(self, who: str) -> None:
        self.peers.pop(who, None)
        self.held.discard(who)
        self.departed.add(who)
        self.speed.pop(who, None)

    # -- drift and arrivals ------------------------------------------------------------------------
    def _on_stats(self, sender: str, msg: messages.Stats, now: float) -> list[Effect]:
        show_stats(self.state, msg)
        if not self.serving or not self.settings.replan:
            return []
        self.budget.observe(now, {n: self.speed.get(n, 1.0) * s.measured_s / s.predicted_s
                                  for n, s in msg.stages.items() if s.measured_s is not None and s.predicted_s > 0})
        drift = self.drift.observe(now, {n: (s.predicted_s, s.measured_s) for n, s in msg.stages.items()})
        if drift is None:
            return []
        stages = {n: (s.predicted_s, s.measured_s) for n, s in self.state.stages.items()}
        verdict = self.budget.weigh(now, drift, self.speed, measured_speed(self.speed, stages, drift))
        if verdict.note is not None:
            self.state.log(verdict.note)
        if verdict.speed is None:
            self.drift.dismiss(drift.member, now, verdict.quiet_until)
            return []
        return self._on_drift(drift, verdict.speed, now) if self._worth_planning_again(drift, verdict.speed, now) \
            else []

    def _worth_planning_again(self, drift: Drift, speed: dict[str, float], now: float) -> bool:
        """Whether a plan with every member at `speed` (as measured) cuts the slowest stage by GAIN or more
        (a machine loaded as a whole slows every stage alike: moving blocks would not help, and costs KV)."""
        new = self._slowest([n for n in self.order if n in self.peers], speed)
        slowest = max((drift.measured_s if n == drift.member else s.measured_s or s.predicted_s
                       for n, s in self.state.stages.items()), default=0.0)
        if cuts_enough(slowest, new):
            return True
        self.drift.dismiss(drift.member, now)
        again = f"{new * 1e3:.1f} ms planned again" if new is not None else "no feasible plan"
        self.state.log(f"{drift.text()}; a new plan would not help (slowest stage {slowest * 1e3:.1f} ms now, {again})")
        return False

    def _on_drift(self, drift: Drift, speed: dict[str, float], now: float) -> list[Effect]:
        """End this epoch to plan again with every member at `speed`, the one it shows."""
        slower = {n: f / self.speed.get(n, 1.0) for n, f in speed.items() if f != self.speed.get(n, 1.0)}
        self.speed = speed
        self.drift.planned_again(drift.member, now)
        self.budget.planned(now)
        was = max((s.measured_s or s.predicted_s for s in self.state.stages.values()), default=0.0)
        self.state.replans.append({"member": drift.member, "predicted_s": drift.predicted_s,
                                   "measured_s": drift.measured_s, "was_bottleneck_s": was, "slower": slower})
        return self._plan_again(drift.text(), now)

    def _weigh_arrivals(self, now: float) -> list[Effect]:
        """Plan in the first held arrival that cuts the slowest stage by GAIN (the others stay held)."""
        while self.arrivals:
            name = self.arrivals.pop(0)
            if name not in self.held:
                continue
            slowest, new = self._slowest(self.order), self._slowest([*self.order, name])
            if cuts_enough(slowest, new):
                assert slowest is not None and new is not None
                self.held.discard(name)
                self.state.replans.append({"member": name, "why": "joined", "was_bottleneck_s": slowest})
                return self._plan_again(f"{name} joined: slowest stage {slowest * 1e3:.1f} ms, "
                                        f"{new * 1e3:.1f} ms with it", now)
            with_it = f"{new * 1e3:.1f} ms" if new is not None else "no feasible plan"
            self.state.log(f"{name} waits: a plan with it would not cut the slowest stage by {GAIN:.0%} "
                           f"({(slowest or 0.0) * 1e3:.1f} ms now, {with_it} with it)")
        return []

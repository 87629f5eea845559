"""A session of fifty members on a fake clock, driving the real coordinator machine (coordinator/machine.py).

Members are small in-memory models of a member process: they answer assignments (`loaded`, `ready`), serve,
and, as the head, send `stats` every second and answer requests. On them the world happens at random (seeded):
joins, polite leaves, crashes (its neighbours report it; the coordinator's ping goes unanswered), one-time
slow-downs, members whose speed swings 3× every 40 s, and one misbehaving member that lies about others'
losses and forges the head's messages. The coordinator's own process crashes too: the survivors choose its
successor from their roster with the members' real rule (member.takeover.successor), and the successor runs
a new machine with the settings of its last assignment.

`Fleet.run` returns what the invariants are checked on (`Record`); the planner is the real cost model over
a speed-proportional split (the real search takes 0.7 s a plan at fifty members).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kafila.model.describe import describe_model
from kafila.model.embedded import default_model_path
from kafila.net.nat import NatClass
from kafila.net.trust import VerifiedMember
from kafila.planner import Member, ModelSpec, Plan, Workload
from kafila.planner.cost import make_ctx
from kafila.planner.placement import describe
from kafila.session.coordinator import effects as fx
from kafila.session.coordinator.builds import RingBuilds
from kafila.session.coordinator.loss_reports import Probe
from kafila.session.coordinator.machine import Coordinator
from kafila.session.coordinator.planning import Planner
from kafila.session.delivery.local_model import MODEL_KEY
from kafila.session.member.takeover import successor
from kafila.session.protocol import messages
from kafila.session.protocol.manifest import StageManifest
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState

N = 50
MALLORY = "m49"  # the misbehaving member
HOLDERS = frozenset(f"m{i:02d}" for i in range(0, N, 5))  # joined with their own copy of the model
SETTINGS = SessionSettings(context=1024, concurrency=2, batch=64, speculate="off", copy=False, stall_s=60.0)
LATENCY_S = 0.05
PING_S = 5.0  # the coordinator's ping bound: a crashed member's link is silent this long
STAGE = StageManifest("0" * 64, 1, 1 << 20, ("0" * 64,))


def quick_plan(members: list[Member], model: ModelSpec, workload: Workload) -> Plan:
    """The planner's cost model over a split in name order, each member's share of blocks its speed's."""
    ms = sorted(members, key=lambda m: m.name)
    ctx = make_ctx(ms, model, workload)
    weights = [m.bandwidth for m in ms]
    total, cum, bounds = sum(weights), 0.0, [0]
    for i, w in enumerate(weights[:-1]):
        cum += w
        bounds.append(min(max(bounds[-1] + 1, round(cum / total * ctx.k)), ctx.k - (len(ms) - i - 1)))
    bounds.append(ctx.k)
    ranges = [(bounds[i], bounds[i + 1]) for i in range(len(ms))]
    placement = describe("kafila", ctx, ms, range(len(ms)), ranges)
    return Plan(placement, {}, None, model.name, workload, 0.0, False)


@dataclass
class Proc:
    """A member's process: alive or not, its speed over time, and what its coordinator told it."""

    name: str
    slowness: Callable[[float], float] = lambda t: 1.0
    alive: bool = False
    coordinator: int | None = None  # which coordinator (an index into Fleet.hosts) it follows
    assign: messages.Assign | None = None
    roster: messages.Roster | None = None
    serving: bool = False
    leaving: bool = False

    def peer(self) -> VerifiedMember:
        m = {"bw": 1e10 * (1 + int(self.name[1:]) % 3), "ubw": 1e10, "disp": 1e-4, "mem": 8 << 30}
        if self.name in HOLDERS:
            m[MODEL_KEY] = "a" * 64
        return VerifiedMember(self.name.encode(), self.name, self.name.encode().ljust(32, b"\0"),
                              NatClass.PERMISSIVE, None, None, None, 1.0, m)


@dataclass
class Host:
    """A coordinator's process: its machine, and the member process it runs beside."""

    machine: Coordinator
    beside: str
    since: float
    alive: bool = True
    serving: tuple[str, ...] = ()
    speed_at_plan: dict[str, float] = field(default_factory=dict)


@dataclass
class Request:
    host: int
    ended: list[str] = field(default_factory=list)  # each end: "finished" or "failed: <the notice>"


@dataclass
class Record:
    """What happened, for the invariants."""

    coordinators: list[tuple[float, str, SessionSettings]] = field(default_factory=list)
    heirs: list[set[str]] = field(default_factory=list)  # at each coordinator loss: whom the survivors chose
    live_at_once: list[int] = field(default_factory=list)  # coordinators alive, after every event
    requests: dict[int, Request] = field(default_factory=dict)
    evicted: list[tuple[float, str, str]] = field(default_factory=list)  # (when, who, why) while alive
    epochs: list[float] = field(default_factory=list)  # when each plan was made
    drift_replans: list[float] = field(default_factory=list)
    forged_delivered: int = 0  # head-only messages from anyone but the head that had an effect


class Fleet:
    """The simulated session; `tamper(machine)` breaks a rule on every coordinator (None: the rules hold)."""

    def __init__(self, seed: int, until_s: float, tamper: Callable[[Coordinator], None] | None = None) -> None:
        self.rng, self.until, self.tamper = random.Random(seed), until_s, tamper
        self.now, self.seq = 0.0, itertools.count()
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.procs = {f"m{i:02d}": Proc(f"m{i:02d}") for i in range(N)}
        self.hosts: list[Host] = []
        self.record = Record()
        self.info = describe_model(default_model_path())
        blocks = 3 * N  # a model with blocks enough for every member
        self.info = replace(self.info, n_blocks=blocks, blocks_bytes=(50 << 20,) * blocks,
                            kv_bytes_per_token=self.info.kv_bytes_per_token[:1] * blocks)
        self.request_ids = itertools.count(1)

    # -- the clock ---------------------------------------------------------------------------------
    def at(self, t: float, do: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.seq), do))

    def run(self) -> Record:
        first = [f"m{i:02d}" for i in range(N - 7)] + [MALLORY]  # the rest come late
        for name in first:
            self.procs[name].alive = True
        self._new_host("m00", first, start=True)
        for name in self.procs:
            self._schedule_life(name)
            if name not in first:  # a friend arriving late
                self.at(self.rng.uniform(60, 2000), lambda name=name: self._join(name))
        self.at(5.0, self._client)
        self.at(10.0, self._tick)
        for t in (3000.0, 7000.0):  # the coordinator's own process crashes
            self.at(t, lambda: self._crash(self.hosts[-1].beside))
        while self.events and self.events[0][0] <= self.until:
            self.now, _, do = heapq.heappop(self.events)
            do()
            self.record.live_at_once.append(sum(h.alive for h in self.hosts))
        for req in self.record.requests.values():  # the session closes: what is left ends, saying so
            if not req.ended:
                req.ended.append("failed: the session closed")
        return self.record

    # -- coordinators ------------------------------------------------------------------------------
    def _new_host(self, beside: str, members: Sequence[str], start: bool, settings: SessionSettings = SETTINGS) -> None:
        state = SessionState(role="host", me=beside, phase="waiting")
        machine = Coordinator(settings, state, Planner(self.info, settings, quick_plan), RingBuilds("sim"))
        if self.tamper is not None:
            self.tamper(machine)
        self.hosts.append(Host(machine, beside, self.now))
        index = len(self.hosts) - 1
        self.record.coordinators.append((self.now, beside, settings))
        for name in members:
            self.procs[name].coordinator = index
            self._apply(index, machine.join(self.procs[name].peer(), self.now))
        if start:
            self.at(self.now + 30.0, lambda: self._apply(index, machine.start(self.now)))

    def _host_of(self, name: str) -> tuple[int, Host] | None:
        p = self.procs[name]
        if p.coordinator is None or not self.hosts[p.coordinator].alive:
            return None
        return p.coordinator, self.hosts[p.coordinator]

    def _say(self, name: str, msg: messages.Control, delay: float = LATENCY_S) -> None:
        """`name` sends `msg` to its coordinator, which hears it on `name`'s own link."""
        def arrive() -> None:
            found = self._host_of(name)
            if found is not None and self.procs[name].alive:
                index, host = found
                before = host.machine.state.phase
                effects = host.machine.handle(name, msg, self.now)
                if isinstance(msg, messages.Stats | messages.ChatEvt) and name != (host.serving or ("",))[0] \
                        and (effects or host.machine.state.phase != before):
                    self.record.forged_delivered += 1
                self._apply(index, effects)
        self.at(self.now + delay, arrive)

    def _apply(self, index: int, effects: list[fx.Effect]) -> None:
        host = self.hosts[index]
        if not host.alive:
            return
        for e in effects:
            if isinstance(e, fx.Send):
                self._deliver(index, e.to, e.msg)
            elif isinstance(e, fx.Cut):
                self.record.epochs.append(self.now)
                host.speed_at_plan = dict(host.machine.speed)
                self.at(self.now + 1.0, lambda e=e: self._assign(index, e))
            elif isinstance(e, fx.Serve):
                host.serving = e.order
            elif isinstance(e, fx.Announce):
                self._announce(index, e.order)
            elif isinstance(e, fx.Stop):
                host.serving = ()
                if "than planned (" in e.reason:
                    self.record.drift_replans.append(self.now)
                self._end_requests(index, f"failed: {e.reason}")
            elif isinstance(e, fx.Close):
                p = self.procs[e.who]
                if p.alive and p.coordinator == index and not p.leaving:
                    self.record.evicted.append((self.now, e.who, (host.machine.state.members.get(e.who, None)
                                                and host.machine.state.members[e.who].note) or ""))
                    self._leave(e.who)
                    self.at(self.now + 120.0, lambda who=e.who: self._join(who))  # it restarts
            elif isinstance(e, fx.Pass) and isinstance(e.msg, messages.ChatEvt):
                req = self.record.requests.get(int(e.msg.id))
                if req is not None and req.host == index and not req.ended:
                    req.ended.append("finished")
            elif isinstance(e, Probe):
                p = self.procs[e.who]
                up = p.alive and p.coordinator == index
                self.at(self.now + (0.1 if up else PING_S), lambda who=e.who, up=up: self._apply(
                    index, host.machine.probed(who, up, "it did not answer the coordinator's ping", self.now)))
            elif isinstance(e, fx.Exit):
                host.alive = False
                self._end_requests(index, f"failed: the session ended (status {e.status})")

    def _assign(self, index: int, cut: fx.Cut) -> None:
        host, p = self.hosts[index], cut.placement
        if not host.alive or host.machine.epoch != cut.epoch:
            return
        for name in p.order:
            msg = messages.Assign(epoch=cut.epoch, order=p.order, head=p.order[0], ranges=dict(p.ranges),
                                  settings=host.machine.settings, plan=host.machine.state.plan or {}, model="sim",
                                  stage=STAGE)
            self._deliver(index, name, msg)
        self._apply(index, host.machine.delivered(cut.epoch, self.now))

    def _announce(self, index: int, order: tuple[str, ...]) -> None:
        host = self.hosts[index]
        measured = {n: messages.Measured(1e10, 1e-4, 8 << 30, 1e10, "permissive", 1.0) for n in order}
        roster = messages.Roster(host.beside, "sim", measured, host.beside, tuple(n for n in order if n in HOLDERS))
        for n in order:
            self._deliver(index, n, roster)

    def _end_requests(self, index: int, why: str) -> None:
        for req in self.record.requests.values():
            if req.host == index and not req.ended:
                req.ended.append(why)

    # -- members -----------------------------------------------------------------------------------
    def _deliver(self, index: int, to: str, msg: messages.Control) -> None:
        def arrive() -> None:
            p = self.procs[to]
            if not p.alive or p.coordinator != index or not self.hosts[index].alive:
                return
            if isinstance(msg, messages.Assign):
                p.assign, p.serving = msg, False
                self._say(to, messages.Loaded(msg.epoch), delay=self.rng.uniform(1.0, 8.0))
            elif isinstance(msg, messages.Connect):
                self._say(to, messages.Ready(msg.epoch, None), delay=self.rng.uniform(0.1, 1.0))
            elif isinstance(msg, messages.Admit) and p.assign is not None and p.assign.epoch == msg.epoch:
                p.serving = True
                if p.assign.head == to:
                    self.at(self.now + 1.0, lambda: self._stats(to, msg.epoch))
            elif isinstance(msg, messages.Lost | messages.Replan):
                p.serving = False
            elif isinstance(msg, messages.Roster):
                p.roster = msg
        self.at(self.now + LATENCY_S, arrive)

    def _stats(self, head: str, epoch: int) -> None:
        """The head's `stats` each second: each stage's time, at the speed its member runs at now."""
        p, found = self.procs[head], self._host_of(head)
        if not p.alive or not p.serving or p.assign is None or p.assign.epoch != epoch or found is None:
            return
        host = found[1]
        seconds = p.assign.plan.get("stage_seconds", {})
        jitter = 1 + 1e-6 * (int(self.now) % 2)  # a decoding ring's medians move: fresh news each second
        stages = {n: messages.StageTime(s, s * self.procs[n].slowness(self.now) * jitter
                                        / host.speed_at_plan.get(n, 1.0)) for n, s in seconds.items()}
        self._say(head, messages.Stats(stages, None, None))
        self.at(self.now + 1.0, lambda: self._stats(head, epoch))

    def _tick(self) -> None:
        """The shell's timer: the stall limit."""
        self.at(self.now + 10.0, self._tick)
        index = len(self.hosts) - 1
        if self.hosts[index].alive:
            self._apply(index, self.hosts[index].machine.timer(self.now))

    def _client(self) -> None:
        """A request to the coordinator's API every 5 s; the head answers it within 3 s."""
        self.at(self.now + 5.0, self._client)
        index = len(self.hosts) - 1
        host = self.hosts[index]
        if not host.alive or not host.serving:
            return
        rid = next(self.request_ids)
        self.record.requests[rid] = Request(index)
        head, epoch = host.serving[0], host.machine.epoch
        answer = messages.ChatEvt(str(rid), "host", {"done": True})

        def answered() -> None:
            if host.alive and host.serving and host.serving[0] == head and host.machine.epoch == epoch:
                self._say(head, answer)
        self.at(self.now + self.rng.uniform(0.5, 3.0), answered)

    def _join(self, name: str) -> None:
        p, index = self.procs[name], len(self.hosts) - 1
        if p.alive or not self.hosts[index].alive:
            return
        p.alive, p.coordinator, p.assign, p.serving = True, index, None, False
        self.at(self.now + LATENCY_S, lambda: self._apply(index, self.hosts[index].machine.join(p.peer(), self.now)))

    def _leave(self, name: str) -> None:
        p = self.procs[name]
        p.alive, p.serving, p.assign, p.leaving = False, False, None, False

    def _schedule_life(self, name: str) -> None:
        """What happens to this member over the session, at random."""
        rng, p = self.rng, self.procs[name]
        i = int(name[1:])
        if i in (7, 13, 21):  # swings between 3× slower and its speed every 40 s
            p.slowness = lambda t: 3.0 if int(t // 40) % 2 else 1.0
        elif i in (3, 17):  # slows down once, for good
            when = rng.uniform(500, 8000)
            p.slowness = lambda t, when=when: 2.5 if t >= when else 1.0
        if name == MALLORY:
            self.at(400.0, self._misbehave)
            return
        for _ in range(rng.randint(0, 3)):
            t = rng.uniform(60, self.until)
            what = rng.choice(("join", "leave", "crash"))
            self.at(t, lambda what=what: self._happen(name, what))

    def _happen(self, name: str, what: str) -> None:
        p = self.procs[name]
        if what == "join":
            self._join(name)
        elif what == "leave" and p.alive and (found := self._host_of(name)) is not None:
            epoch, p.leaving = found[1].machine.epoch, True
            self._say(name, messages.Lost(name, "it leaves the session", epoch))  # its own word, then it goes
            self.at(self.now + 0.2, lambda: self._leave(name))
        elif what == "crash" and p.alive and all(h.beside != name for h in self.hosts if h.alive):
            self._crash(name)
            self.at(self.now + self.rng.uniform(60, 600), lambda: self._join(name))

    def _crash(self, name: str) -> None:
        """`name`'s process dies silently: its ring neighbours report it, its coordinator's link goes quiet."""
        p, found = self.procs[name], self._host_of(name)
        order = p.assign.order if p.assign is not None and p.serving else ()
        self._leave(name)
        if found is None:
            return
        index, host = found
        if host.beside == name:
            self._coordinator_lost(index)
            return
        if name in order:
            i = order.index(name)
            for n in {order[i - 1], order[(i + 1) % len(order)]} - {name}:
                self._say(n, messages.Lost(name, "its ring edge failed", self.procs[n].assign.epoch
                                           if self.procs[n].assign else 0), delay=1.0)
        self.at(self.now + PING_S, lambda: self._apply(index, host.machine.link_down(name, "link idle", self.now)))

    def _coordinator_lost(self, index: int) -> None:
        """The coordinator's process died: every survivor picks the successor from its own roster."""
        host = self.hosts[index]
        host.alive = False
        self._end_requests(index, f"failed: the coordinator ({host.beside}) was lost")
        survivors = [p for p in self.procs.values() if p.alive and p.coordinator == index and p.roster and p.assign]
        for p in self.procs.values():  # one that never served knows no successor: it ends, and joins again later
            if p.alive and p.coordinator == index and p not in survivors:
                self._leave(p.name)
                self.at(self.now + 120.0, lambda name=p.name: self._join(name))
        chosen = {successor(p.roster, p.assign.order) for p in survivors}  # type: ignore[arg-type]
        self.record.heirs.append(chosen)
        heir = next(iter(chosen)) if len(chosen) == 1 else None
        if heir is None or not self.procs[heir].alive:  # nobody can coordinate: the session ends here
            return
        settings = self.procs[heir].assign.settings  # type: ignore[union-attr]  # an heir was assigned
        self._new_host(heir, [p.name for p in survivors], start=True, settings=settings)

    def _misbehave(self) -> None:
        """The misbehaving member: every 60 s it reports someone lost and forges the head's messages."""
        self.at(self.now + 60.0, self._misbehave)
        p, found = self.procs[MALLORY], self._host_of(MALLORY)
        if not p.alive or found is None:
            return
        machine = found[1].machine
        others = [n for n in machine.peers if n != MALLORY]
        if not others:
            return
        victim = self.rng.choice(others)
        order = p.assign.order if p.assign else ()
        if order and MALLORY in order and self.rng.random() < 0.5:  # sometimes about a neighbour of its own
            victim = order[(order.index(MALLORY) + 1) % len(order)]
        self._say(MALLORY, messages.Lost(victim, "made up", machine.epoch))
        self._say(MALLORY, messages.Stats({victim: messages.StageTime(0.001, 1.0)}, None, None))
        self._say(MALLORY, messages.ChatEvt(str(max(self.record.requests, default=0)), "host", {"done": True}))


def evicted_live(record: Record) -> list[tuple[float, str, str]]:
    """Members evicted while alive and answering, other than the misbehaving one."""
    return [e for e in record.evicted if e[1] != MALLORY]


def replans_per_hour(times: list[float], until_s: float) -> list[int]:
    return [sum(1 for t in times if h * 3600 <= t < (h + 1) * 3600) for h in range(int(until_s // 3600) + 1)]


def summary(record: Record) -> dict[str, Any]:
    return {"coordinators": len(record.coordinators), "requests": len(record.requests),
            "epochs": len(record.epochs), "drift": len(record.drift_replans), "evicted": len(record.evicted)}

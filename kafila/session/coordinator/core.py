"""The coordinator's shared state: the members connected to it, the ring serving, the epoch, the losses queued.

The coordinator's parts (admission, member_messages, epochs, losses) extend this core; runtime.HostRuntime
joins them into the coordinator a host (or a member that took coordination over) runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity
from kafila.errors import NetworkError, ProtocolError
from kafila.model.describe import ModelInfo
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.mandate import Credential
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.planner import Plan
from kafila.session.api.server import ApiServer, Forwarder
from kafila.session.coordinator.builds import RingBuilds, build_tag
from kafila.session.coordinator.drift import Drift, DriftWatch
from kafila.session.coordinator.loss_reports import LossReports
from kafila.session.coordinator.replan_budget import ReplanBudget
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.options import HostOptions
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, Via, refusal
from kafila.session.protocol.manifest import StageManifest
from kafila.session.state import SessionState

log = logging.getLogger("kafila.host")


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
    asked: set[int] = field(default_factory=set)  # this epoch's chunks it asked for: each is sent once
    progress_at: float = 0.0  # loop time of the last sign of progress: stage bytes moving, any message
    step: str = "receiving its stage"  # what it was doing then, for a person


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


class CoordinatorCore:
    """The host's session after it is open: the state every part of the coordinator shares."""

    _tg: asyncio.TaskGroup  # the running coordinator's tasks (HostRuntime.run)

    def __init__(self, ep: PeerEndpoint, opts: HostOptions, state: SessionState, model: Path, info: ModelInfo,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None, beside: str | None = None,
                 serving: messages.Assign | None = None, departed: frozenset[str] = frozenset(),
                 credential: Credential | None = None) -> None:
        self.ep, self.opts, self.state, self.model, self.info, self.cache, self.api = (
            ep, opts, state, model, info, cache, api)
        self.settings = opts.settings  # the session's: sent in every assignment, kept by whoever coordinates next
        self.beside = beside  # the ring member in this process (lost with it); None: this process only coordinates
        self.serving = serving  # a ring already serving, to take over as it is (its coordinator held no stage)
        self.departed = set(departed)  # ring members lost so far: one that comes back (restarted) may rejoin
        self.order: list[str] = []  # the ring serving now (empty before the first admission)
        self.ring: tuple[str, ...] = ()  # this epoch's ring, from its assignment on: who may say what (authority)
        self._replanning = False  # a loss ended this epoch: members' reports of it are stale (_on_lost_report)
        self.use = use  # the cut stages this session serves: `kafila cache --prune` leaves them
        self.joined: dict[str, Joined] = {}
        self.measuring: dict[str, Arrival] = {}  # connected, not measured yet (admission._measured)
        self.lost: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.reports = LossReports()  # neighbours' loss reports, confirmed on our own link first (losses.py)
        self.broken: asyncio.Queue[str] = asyncio.Queue()  # a ring broke and nobody is lost: plan again over all
        self.drift = DriftWatch()  # members running slower (or faster) than the plan says
        self.drifted: asyncio.Queue[Drift] = asyncio.Queue()
        self.speed: dict[str, float] = {}  # member → its stage time over its probe's, as measured serving
        self.budget = ReplanBudget()  # how soon a drift may re-plan again, each member's slowest recent speed
        self.forwarder: Forwarder | None = None
        self.epoch = 0
        self.plan: Plan | None = None
        self._arrived = asyncio.Event()
        # members that came after the first plan (late, or lost and back): each is planned in when worth it,
        # held out of plans until then (a slow one must not hold back a fast one that comes after it)
        self.arrivals: asyncio.Queue[str] = asyncio.Queue()
        self.held: set[str] = set()
        self.my_build = build_tag(build_identity())
        # one handler per control message type a member sends (HostRuntime fills it from every part)
        self._handlers: dict[type[messages.Control], Callable[[Joined, Any], None]] = {}
        self.builds = RingBuilds(self.my_build)
        self._model_sha256: str | None = None  # hashed when a member first announces its own copy
        self.copies: set[str] = set()  # members given a copy of the model, verified (model_copy.py)
        self.credential = credential  # what this coordinator announces: it coordinates (kafila.net.mandate)

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

    def ring_view(self) -> RingView:
        """This epoch's ring and the admitted members, for checking who may send what (protocol.authority)."""
        return RingView(self.ring, frozenset(self.joined))

    async def _recv_loop(self, name: str, link: Link) -> None:
        try:
            while True:
                msg = messages.decode(await link.recv())
                j = self.joined.get(name)
                handler = self._handlers.get(type(msg))
                if j is None:
                    return
                j.progress_at = asyncio.get_running_loop().time()
                refused = refusal(Sender(name, Via.MEMBER), msg, self.ring_view())
                if refused is not None:  # never handled (protocol.authority)
                    log.warning("refused %s", refused)
                    continue
                if handler is None:
                    log.warning("ignored a %r message from %s", msg.T, name)
                    continue
                handler(j, msg)
        except (NetworkError, ProtocolError) as exc:
            if name in self.joined:
                self.lost.put_nowait((name, str(exc)))

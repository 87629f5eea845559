"""A member's shared state once it is connected to its coordinator: its assignment, stage worker, ring edges.

The member's parts (stage, serving, takeover) extend this core; runtime.MemberRuntime joins them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from kafila.engine.draft import DraftModel
from kafila.engine.stage import ContextConfig
from kafila.errors import ProtocolError
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint, RingEdges
from kafila.net.quic import Link
from kafila.session.api.server import ApiServer, Forwarder
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.member.throttle import Throttle
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.ring.head import Head
from kafila.session.ring.stage_runtime import StageWorker
from kafila.session.state import SessionState

log = logging.getLogger("kafila.member")


class MemberCore:
    """Everything a member does after it is connected to the host: the state its parts share."""

    _tg: asyncio.TaskGroup  # the running member's tasks (MemberRuntime.run)

    def __init__(self, ep: PeerEndpoint, control: Link, state: SessionState, opts: MemberOptions,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None) -> None:
        self.ep, self.control, self.state, self.opts, self.cache, self.api = ep, control, state, opts, cache, api
        self.use = use  # the delivered stage this member serves: `kafila cache --prune` leaves it
        self.worker: StageWorker | None = None
        self.draft: DraftModel | None = None  # as the head: the draft model that drafts for speculation
        self.throttle = Throttle(opts.throttle_schedule or ((0.0, opts.throttle),))  # EMULATION
        self.head: Head | None = None
        self.forwarder: Forwarder | None = None
        self.edges: RingEdges | None = None
        self.assignment: messages.Assign | None = None
        self.roster: messages.Roster | None = None  # the coordinator's replicated state
        self.model_copy: Path | None = None  # a verified copy of the model the host gave (member.model_copy)
        self._serving: asyncio.Task[None] | None = None
        self._ring_up = asyncio.Event()  # _serve has made this epoch's head or forwarder
        self._pending: list[messages.Control] = []
        self._ended: str | None = None  # why the session cannot go on, as a ring neighbour said it
        self._gone: set[bytes] = set()  # coordinators lost so far (their endpoints' member ids)
        self._heirs: set[str] = set()  # members that took coordination over, so that a failed takeover is not retried
        self._coordinating: asyncio.Task[None] | None = None  # this process coordinates the session (a takeover)

    @property
    def _assigned(self) -> messages.Assign:
        if self.assignment is None:
            raise ProtocolError("the host sent a ring instruction before assigning a stage")
        return self.assignment

    def _config(self) -> ContextConfig:
        """The host's context settings for every stage, with this machine's own thread count."""
        c = self._assigned.config  # from the session's settings: each a positive int (validated by decode)
        return ContextConfig(n_ctx_per_seq=c["n_ctx_per_seq"], n_seq_max=c["n_seq_max"], n_batch=c["n_batch"],
                             n_threads=self.opts.threads)

    async def _on_copy_chunk(self, raw: bytes) -> None:
        raise NotImplementedError  # member.model_copy.ModelCopy's

    async def send_host(self, msg: messages.Control) -> None:
        """Send a control message to the coordinator."""
        await self.control.send(messages.encode(msg))

    async def _next_control(self) -> messages.Control:
        if self._pending:
            return self._pending.pop(0)
        while True:
            raw = await self.control.recv()
            kind = messages.kind(raw)
            if kind == "control":
                return messages.decode(raw)
            if kind == "copy":
                await self._on_copy_chunk(raw)
                continue
            log.warning("ignored a stray %s message from the host", kind)

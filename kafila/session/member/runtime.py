"""A member connected to its coordinator: it follows the coordinator's instructions, one handler per message.

MemberRuntime joins the member's parts over their shared core: stage (an epoch's stage and edges), serving
(the admitted ring) and takeover (the coordinator gone). One code path whether the member is the head or
not, and whether the ring runs on one machine or across the world: only the links differ.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from kafila.errors import KafilaError, NetworkError, SessionError
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.session.api.server import ApiServer
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.delivery.local_model import model_proof
from kafila.session.member.core import log
from kafila.session.member.model_copy import ModelCopy
from kafila.session.member.stage import MemberStage
from kafila.session.member.takeover import Takeover
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, Via, chat_owner, refusal
from kafila.session.state import SessionState


class MemberRuntime(MemberStage, Takeover, ModelCopy):
    """Everything a member does after it is connected to the host."""

    def __init__(self, ep: PeerEndpoint, control: Link, state: SessionState, opts: MemberOptions,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None) -> None:
        super().__init__(ep, control, state, opts, cache, api, use)
        # what each of the host's messages does; a handler returns an exit status to end the session
        self._handlers: dict[type[messages.Control], Callable[[Any], Awaitable[int | None]]] = {
            messages.Assign: self._on_assign,
            messages.Connect: self._on_connect,
            messages.Admit: self._on_admit,
            messages.Reject: self._on_reject,
            messages.Refused: self._on_reject,
            messages.Lost: self._on_lost,
            messages.Replan: self._on_replan,
            messages.Chat: self._on_chat,
            messages.Bye: self._on_bye,
            messages.Roster: self._on_roster,
            messages.Prove: self._on_prove,
            messages.Copy: self._on_copy,
        }

    async def run(self) -> int:
        """Follow the host's instructions until it says bye; returns the exit status."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                while True:
                    try:
                        msg = await self._next_control()
                    except NetworkError as exc:  # the host is gone: the ring may well serve on without it
                        status = await self._without_coordinator(str(exc))
                        if status is not None:
                            return status
                        continue  # connected to the member that coordinates now
                    refused = refusal(Sender(self.control.peer.name, Via.COORDINATOR), msg, RingView())
                    if refused is not None:  # never handled (protocol.authority)
                        log.warning("refused %s", refused)
                        continue
                    handler = self._handlers.get(type(msg))
                    if handler is None:
                        log.warning("ignored a %r message from the host", msg.T)
                        continue
                    status = await handler(msg)
                    if status is not None:
                        return status
            finally:
                await self._stop_serving("this member is leaving")
                if self._coordinating is not None:  # the coordinator lives and ends with this process's member
                    self._coordinating.cancel()

    # -- the host's messages (one handler per type) ---------------------------------------------
    async def _on_assign(self, msg: messages.Assign) -> None:
        await self._stop_serving(None)
        await self._setup(msg)

    async def _on_connect(self, msg: messages.Connect) -> None:
        await self._connect()

    async def _on_admit(self, msg: messages.Admit) -> None:
        self.throttle.start()
        self._ring_up.clear()
        self._serving = self._tg.create_task(self._serve())
        self.state.lost = None  # an earlier loss is behind us: this ring serves
        self.state.set_phase("admitted", "admitted: serving")

    async def _on_reject(self, msg: messages.Reject | messages.Refused) -> None:
        self.state.rejection = msg.reason
        self.state.set_phase("rejected", f"{msg.T}: {msg.reason}")
        raise SessionError(f"the session was {'rejected' if msg.T == 'reject' else 'refused'}: {msg.reason}")

    async def _on_lost(self, msg: messages.Lost) -> None:
        await self._stop_serving(f"member {msg.who} was lost: {msg.reason}", lost=msg.who)

    async def _on_replan(self, msg: messages.Replan) -> None:
        await self._stop_serving(f"the ring is planned again: {msg.reason}")

    async def _on_chat(self, msg: messages.Chat) -> None:
        # The host sends its first chat as soon as it has admitted the ring: it can be read in the same
        # turn as the admission, before the serving task that makes the head has run. Dropped, its
        # request would wait for an answer forever.
        serving = self._serving
        if self.head is None and serving is not None and not serving.done() and not self._ring_up.is_set():
            up = asyncio.ensure_future(self._ring_up.wait())
            try:
                await asyncio.wait({up, serving}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
        if self.head is not None:
            owner = chat_owner(Sender(self.control.peer.name, Via.COORDINATOR), msg)  # never its declared origin
            self.head.serve_remote(msg, self.control.send, owner)
            return
        # not serving: a loss ended this ring, and the API server sends the request again to the next one
        down = self._serving is None or self._serving.done()
        why = "its ring is not serving" if down else "it is not the ring's head"
        log.warning("chat %s from %s reached %s, but %s", msg.id, msg.origin, self.opts.name, why)
        with contextlib.suppress(KafilaError):
            self.control.post(messages.encode(messages.ChatEvt(msg.id, msg.origin, {
                "error": f"the chat reached {self.opts.name}, but {why}", "resumable": down})))

    async def _on_prove(self, msg: messages.Prove) -> None:
        """Show the coordinator we hold the model file we announced (it reads pieces of it too)."""
        if self.opts.model is not None:
            digest = await asyncio.to_thread(model_proof, self.opts.model, bytes.fromhex(msg.nonce))
            await self.send_host(messages.Proof(digest))

    async def _on_roster(self, msg: messages.Roster) -> None:
        """The coordinator's state: kept, so that this member knows the ring without its host."""
        self.roster = msg
        self.state.coordinator = self.state.coordinator or msg.coordinator
        for name, m in msg.members.items():
            self.state.update_member(name, bandwidth_bytes_per_s=m.bw, dispatch_s=m.disp, memory_bytes=m.mem,
                                     nat=m.nat, rtt_ms=m.rtt_ms)

    async def _on_bye(self, msg: messages.Bye) -> int:
        self.state.set_phase("closed", f"the host closed the session: {msg.reason}")
        return 0


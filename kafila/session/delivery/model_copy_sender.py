"""A copy of the model on a member's disk, so that the ring outlives a host no other member holds it for.

Re-planning after a loss needs the model's bytes to cut new stages from, and a member that takes
coordination over must hold them (member.takeover). When the host's own process serves a stage and no
other ring member holds the model, the host's loss would end the session; so, once a ring is admitted,
the host sends the whole file to the member that would take over (the first ring member after its own:
`takeover.successor`'s choice once it holds it), in the background: the member asks for COPY_BATCH
chunks at a time (`copy_need`), each verified by its sha256 and written to its cache, so the copy is
never more than a batch ahead of the control messages on the same link and a re-plan resumes it. Once
the whole file verifies (`copied`), the member is a holder in the roster, replicated to every member.
Disk only: the copy is not loaded. `kafila host --no-copy` turns it off. The member's `copied` is taken at
its word, as everything an admitted member says about itself is (the group is trusted, DESIGN §5); the
member itself verified every chunk and the whole file against the manifest's hashes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from kafila.errors import NetworkError
from kafila.model.gguf_set import SHARD_NAME
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.session.delivery.local_model import claimed_hash
from kafila.session.delivery.stage_files import manifest_for, megabytes
from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import messages
from kafila.session.protocol.chunks import COPY_MAGIC
from kafila.session.protocol.fields import MAX_CONTROL
from kafila.session.protocol.manifest import StageManifest
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState
from kafila.session.stoppable import run_stoppable

log = logging.getLogger("kafila.host")
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class ModelCopies:
    """The host's side of model copies: whom to give one, its chunks, and who holds one (`copies`)."""

    def __init__(self, state: SessionState, settings: SessionSettings, model: Path, beside: str | None,
                 tell: Callable[[str, messages.Control], Awaitable[bool]], spawn: Spawn) -> None:
        self.state, self.settings, self.model, self.beside, self.tell, self.spawn = (
            state, settings, model, beside, tell, spawn)
        self.copies: set[str] = set()  # members given a copy of the model, verified
        self.manifest: StageManifest | None = None
        self._task: asyncio.Task[None] | None = None  # hashing the model, then offering the copy
        self._heir: str | None = None  # the member offered a copy and not yet holding it
        # the chunks the heir asked for since the last offer: each is sent at most once an offer, so a member's asks
        # can make the host send no more than the model's size an offer (repeated asks resent without limit)
        self._asked: set[int] = set()
        self._sending: set[asyncio.Task[None]] = set()  # the heir's batches on their way

    def holders(self, order: list[str], peers: Mapping[str, VerifiedMember]) -> tuple[str, ...]:
        """The ring members holding the model: announced with it (proved at admission) or given a copy."""
        return tuple(n for n in order if n in self.copies or (n in peers and claimed_hash(peers[n].measurements)))

    def _heir_without_model(self, order: list[str], peers: Mapping[str, VerifiedMember]) -> str | None:
        """The member to give a copy: the first ring member outside this process, when none of them holds the
        model (None: one does, the host serves no stage, copies are off, or nobody else serves)."""
        others = [n for n in order if n != self.beside and n in peers]
        if not self.settings.copy or self.beside not in order or not others or self.holders(others, peers):
            return None
        return others[0]

    def offer(self, order: list[str], peers: Mapping[str, VerifiedMember]) -> None:
        """After an admission: start giving the heir a copy of the model, if the ring needs one."""
        if self._heir_without_model(order, peers) is not None and (self._task is None or self._task.done()):
            self._task = self.spawn(self._send_offer(order, peers))

    async def _send_offer(self, order: list[str], peers: Mapping[str, VerifiedMember]) -> None:
        if SHARD_NAME.match(self.model.name):
            self.state.log("no member gets a copy of the model: a model split into several files is not copied yet")
            return
        if self.manifest is None:
            self.state.log("hashing the model to give a member a copy (so that the ring outlives this host)")
            try:
                self.manifest = await run_stoppable(lambda progress: manifest_for(self.model, progress=progress))
            except OSError as exc:
                self.state.log(f"no member gets a copy of the model: it could not be read ({exc})")
                return
        offer = messages.Copy(self.manifest)
        if len(messages.encode(offer)) > MAX_CONTROL:  # a chunk hash per MiB: past ~60 GB of model
            self.state.log("no member gets a copy of the model: its list of chunk hashes is too long for one message")
            return
        heir = self._heir_without_model(order, peers)  # the ring may have changed while the model was hashed
        if heir is None:
            return
        self._heir, self._asked = heir, set()  # a new offer: the heir may ask again for what it still lacks
        self.state.copies[heir] = self.state.copies.get(heir, 0.0)
        self.state.changed()
        await self.tell(heir, offer)

    def need(self, who: str, link: Link, msg: messages.CopyNeed) -> None:
        """The heir asks for a batch (at most COPY_BATCH chunks: the message's limit), sent in the background: only
        the chunks not sent since the offer, so a member asking again and again gets each chunk once an offer."""
        if self.manifest is None or who != self._heir:
            return
        chunks = sorted({i for i in msg.chunks if 0 <= i < len(self.manifest.chunks)} - self._asked)
        if not chunks:
            return
        self._asked.update(chunks)
        task = self.spawn(self._send_chunks(who, link, self.manifest, chunks))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_chunks(self, who: str, link: Link, manifest: StageManifest, chunks: list[int]) -> None:
        try:
            await send_stage(link, self.model, manifest, chunks, magic=COPY_MAGIC)
        except NetworkError as exc:  # the member is gone: its loss is noticed by its control link
            log.info("stopped sending %s a copy of the model: %s", who, exc)
            return
        if chunks and who == self._heir:  # 1.0 only once the member has verified it (copied)
            done = min((max(chunks) + 1) * manifest.chunk_size, manifest.size) / manifest.size
            self.state.copies[who] = max(self.state.copies.get(who, 0.0), min(done, 0.999))
            self.state.changed()

    def copied(self, who: str, msg: messages.Copied) -> str | None:
        """The heir's copy is whole (or failed): its sha256 once it verified, else None."""
        manifest = self.manifest
        if manifest is None or who != self._heir:
            return None
        self._heir = None
        if msg.sha256 != manifest.sha256:
            self.state.copies.pop(who, None)
            self.state.log(f"{who} holds no copy of the model: {msg.error or 'its copy did not verify'}")
            return None
        self.copies.add(who)
        self.state.copies[who] = 1.0
        self.state.log(f"{who} holds a copy of the model ({megabytes(manifest.size)}): if this host is lost, "
                       f"{who} takes coordination over and re-plans")
        return manifest.sha256

    def lost(self, who: str) -> None:
        """A lost member's copy is gone with it (a restarted one under its name holds none)."""
        self.copies.discard(who)
        self.state.copies.pop(who, None)
        if self._heir == who:
            self._heir = None

    def halt(self) -> None:
        """The ring stops: batches in flight stop too (the heir asks for them again at the next admission's offer)."""
        for task in list(self._sending):
            task.cancel()

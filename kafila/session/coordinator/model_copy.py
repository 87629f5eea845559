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

from kafila.errors import NetworkError
from kafila.model.gguf_set import SHARD_NAME
from kafila.session.coordinator.core import Joined, log
from kafila.session.coordinator.losses import LossHandling
from kafila.session.delivery.local_model import claimed_hash
from kafila.session.delivery.stage_files import manifest_for, megabytes
from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import messages
from kafila.session.protocol.chunks import COPY_MAGIC
from kafila.session.protocol.fields import MAX_CONTROL
from kafila.session.protocol.manifest import StageManifest
from kafila.session.stoppable import run_stoppable


class ModelCopies(LossHandling):
    """The host's side of model copies: whom to give one, its chunks, and the roster once it is held."""

    _copy_manifest: StageManifest | None = None
    _copy_task: asyncio.Task[None] | None = None  # hashing the model, then offering the copy
    _copy_heir: str | None = None  # the member offered a copy and not yet holding it
    _copy_sending: bool = False  # a batch of the heir's is being sent: it asks for the next once that is in

    def _roster(self, order: list[str]) -> messages.Roster:
        raise NotImplementedError  # epochs.Epochs's

    def _holders(self, order: list[str]) -> tuple[str, ...]:
        """The ring members holding the model: announced with it (proved at admission) or given a copy."""
        return tuple(n for n in order if n in self.copies or claimed_hash(self.joined[n].peer.measurements))

    def _heir_without_model(self, order: list[str]) -> str | None:
        """The member to give a copy: the first ring member outside this process, when none of them holds the
        model (None: one does, the host serves no stage, copies are off, or nobody else serves)."""
        others = [n for n in order if n != self.beside and n in self.joined]
        if not self.settings.copy or self.beside not in order or not others or self._holders(others):
            return None
        return others[0]

    def _offer_copy(self) -> None:
        """After an admission: start giving the heir a copy of the model, if the ring needs one."""
        if self._heir_without_model(self.order) is not None and (self._copy_task is None or self._copy_task.done()):
            self._copy_task = self._tg.create_task(self._send_copy_offer())

    async def _send_copy_offer(self) -> None:
        if SHARD_NAME.match(self.model.name):
            self.state.log("no member gets a copy of the model: a model split into several files is not copied yet")
            return
        if self._copy_manifest is None:
            self.state.log("hashing the model to give a member a copy (so that the ring outlives this host)")
            try:
                self._copy_manifest = await run_stoppable(lambda progress: manifest_for(self.model, progress=progress))
            except OSError as exc:
                self.state.log(f"no member gets a copy of the model: it could not be read ({exc})")
                return
        offer = messages.Copy(self._copy_manifest)
        if len(messages.encode(offer)) > MAX_CONTROL:  # a chunk hash per MiB: past ~60 GB of model
            self.state.log("no member gets a copy of the model: its list of chunk hashes is too long for one message")
            return
        heir = self._heir_without_model(self.order)  # the ring may have changed while the model was hashed
        if heir is None:
            return
        self._copy_heir, self._copy_sending = heir, False
        self.state.copies[heir] = self.state.copies.get(heir, 0.0)
        self.state.changed()
        await self._tell(heir, offer)

    def _on_copy_need(self, j: Joined, msg: messages.CopyNeed) -> None:
        manifest, name = self._copy_manifest, j.peer.name
        # only the heir, one batch at a time (at most COPY_BATCH chunks: the message's limit): a member asking
        # again and again gets no more than a copy's worth of bytes in flight
        if manifest is None or name != self._copy_heir or self._copy_sending:
            return
        chunks = [i for i in msg.chunks if 0 <= i < len(manifest.chunks)]
        self._copy_sending = True
        task = self._tg.create_task(self._send_copy_chunks(j, manifest, chunks))
        j.sending.add(task)
        task.add_done_callback(j.sending.discard)

    async def _send_copy_chunks(self, j: Joined, manifest: StageManifest, chunks: list[int]) -> None:
        try:
            await send_stage(j.link, self.model, manifest, chunks, magic=COPY_MAGIC)
        except NetworkError as exc:  # the member is gone: its loss is noticed by its control link
            log.info("stopped sending %s a copy of the model: %s", j.peer.name, exc)
            return
        finally:
            self._copy_sending = False
        if chunks and j.peer.name == self._copy_heir:  # 1.0 only once the member has verified it (_on_copied)
            done = min((max(chunks) + 1) * manifest.chunk_size, manifest.size) / manifest.size
            self.state.copies[j.peer.name] = max(self.state.copies.get(j.peer.name, 0.0), min(done, 0.999))
            self.state.changed()

    def _on_copied(self, j: Joined, msg: messages.Copied) -> None:
        name, manifest = j.peer.name, self._copy_manifest
        if manifest is None or name != self._copy_heir:
            return
        self._copy_heir = None
        if msg.sha256 != manifest.sha256:
            self.state.copies.pop(name, None)
            self.state.log(f"{name} holds no copy of the model: {msg.error or 'its copy did not verify'}")
            return
        self.copies.add(name)
        self._model_sha256 = self._model_sha256 or manifest.sha256
        self.state.copies[name] = 1.0
        self.state.log(f"{name} holds a copy of the model ({megabytes(manifest.size)}): if this host is lost, "
                       f"{name} takes coordination over and re-plans")
        if self.order and self.state.phase == "admitted":  # every member learns the new holder (the next
            self._tg.create_task(self._send_roster(list(self.order)))  # admission's roster says it anyway)

    async def _on_lost(self, who: str, reason: str) -> int | None:
        # a lost member's copy is gone with it (a restarted one under its name holds none)
        self.copies.discard(who)
        self.state.copies.pop(who, None)
        if self._copy_heir == who:
            self._copy_heir = None
        return await super()._on_lost(who, reason)

    async def _send_roster(self, order: list[str]) -> None:
        """The coordinator's state to every ring member still here (a failed send is that member's loss)."""
        order = [n for n in order if n in self.joined]
        roster = self._roster(order)
        for n in order:
            await self._tell(n, roster)

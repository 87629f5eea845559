"""A member's side of a model copy (coordinator.model_copy): the whole model file, received in the background.

The member asks for COPY_BATCH chunks at a time and the next batch once those are verified and written
(on a worker thread: the ring's frames go on meanwhile), so the copy never runs ahead of the control
messages sharing its link by more than a batch. A copy chunk that arrives while a stage is being received
is dropped there (transfer.receive_stage's `aside`); the host's next `copy` (at each admission) resumes
from the `.part` file. Once the whole file verifies the member says so (`copied`) and keeps its path: it
can take coordination over with it (member.takeover).
"""

from __future__ import annotations

import asyncio

from kafila.errors import DiskFullError, KafilaError, ProtocolError
from kafila.session.delivery.stage_files import StageReceiver, megabytes
from kafila.session.member.core import MemberCore
from kafila.session.protocol import chunks, messages


class ModelCopy(MemberCore):
    """Receiving a copy of the model, and the path of the verified one."""

    _copy: StageReceiver | None = None
    _copy_todo: list[int]  # chunks not yet asked for, in order
    _copy_asked: set[int]  # the batch asked for and not yet all here

    async def _on_copy(self, msg: messages.Copy) -> None:
        """The host offers a copy of the model (again at each admission until it is held): check the space, then
        ask for what the `.part` still lacks (nothing once the copy is whole: it is verified and said held)."""
        receiver = StageReceiver(self.cache.root / "copies", msg.manifest)
        if self.use is not None:
            for path in (receiver.part, receiver.final):
                self.use.add(path)
        try:
            self._copy_todo = await asyncio.to_thread(receiver.missing)
            receiver.check_space()
        except (DiskFullError, OSError) as exc:
            self.state.log(f"no copy of the model on this machine: {exc}")
            await self.send_host(messages.Copied(None, f"{self.opts.name} cannot hold a copy: {exc}"))
            return
        self._copy, self._copy_asked = receiver, set()
        self.state.log(f"receiving a copy of the model ({megabytes(msg.manifest.size)}) in the background, so "
                       f"that the session outlives its host")
        await self._ask_copy()

    async def _on_copy_chunk(self, raw: bytes) -> None:
        receiver = self._copy
        if receiver is None:
            return  # a copy given up (or never offered): nothing to store
        index, data = chunks.parse_chunk(raw, chunks.COPY_MAGIC)
        try:
            await asyncio.to_thread(receiver.accept, index, data)
        except (DiskFullError, ProtocolError, OSError) as exc:
            await self._give_copy_up(str(exc))
            return
        self._copy_asked.discard(index)
        if not self._copy_asked:
            await self._ask_copy()

    async def _ask_copy(self) -> None:
        """Ask for the next batch; once none is left, verify the whole file and tell the host."""
        receiver = self._copy
        assert receiver is not None
        batch = [i for i in self._copy_todo[: chunks.COPY_BATCH] if i not in receiver.have]
        del self._copy_todo[: chunks.COPY_BATCH]
        if batch:
            self._copy_asked = set(batch)
            await self.send_host(messages.CopyNeed(tuple(batch)))
        elif self._copy_todo:
            await self._ask_copy()
        else:
            try:
                self.model_copy = await asyncio.to_thread(receiver.finish)
            except (KafilaError, OSError) as exc:
                await self._give_copy_up(str(exc))
                return
            self.state.log(f"this machine holds a copy of the model ({self.model_copy.name}): it can take "
                           f"coordination over if the host is lost")
            await self.send_host(messages.Copied(receiver.manifest.sha256, None))

    async def _give_copy_up(self, why: str) -> None:
        self._copy = None
        self.state.log(f"the copy of the model was given up: {why}")
        await self.send_host(messages.Copied(None, why))

"""What members tell the coordinator while an epoch is set up and served: one handler per message type.

A member asks for its stage's chunks (sent from here), says what it is working on, reports its stage
loaded and its edges ready, and the head sends the ring's statistics and chat replies.
"""

from __future__ import annotations

import asyncio

from kafila.errors import NetworkError
from kafila.session.coordinator.core import CoordinatorCore, Joined, log
from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import messages
from kafila.session.ring.ring_stats import show_stats


class MemberMessages(CoordinatorCore):
    """The coordinator's handlers of members' messages (a member's loss reports are losses.LossHandling's)."""

    def _on_need(self, j: Joined, msg: messages.Need) -> None:
        if msg.epoch != self.epoch or j.manifest is None:
            return
        # each chunk of the stage once an epoch, whatever a member asks (repeated or past-the-end indices
        # made the host send its stage again and again)
        chunks = sorted({i for i in msg.chunks if i < len(j.manifest.chunks)} - j.asked)
        j.asked.update(chunks)
        task = self._tg.create_task(self._send_chunks(j, chunks))
        j.sending.add(task)
        task.add_done_callback(j.sending.discard)

    def _on_working(self, j: Joined, msg: messages.Working) -> None:
        if msg.epoch == self.epoch:  # the message itself was progress (_recv_loop); what it says is for people
            j.step = msg.step

    def _on_loaded(self, j: Joined, msg: messages.Loaded) -> None:
        if msg.epoch == self.epoch and j.loaded is not None and not j.loaded.done():
            j.loaded.set_result(msg)
            self.state.update_member(j.peer.name, status="loaded")

    def _on_ready(self, j: Joined, msg: messages.Ready) -> None:
        if msg.epoch == self.epoch and j.ready is not None and not j.ready.done():
            j.ready.set_result(msg)
            self.state.update_member(j.peer.name, status="ready")

    def _on_stats(self, j: Joined, msg: messages.Stats) -> None:
        show_stats(self.state, msg)
        if self.state.phase != "admitted" or self._replanning or not self.settings.replan:
            return
        now = asyncio.get_running_loop().time()
        self.budget.observe(now, {n: self.speed.get(n, 1.0) * s.measured_s / s.predicted_s
                                  for n, s in msg.stages.items() if s.measured_s is not None and s.predicted_s > 0})
        drift = self.drift.observe(now, {n: (s.predicted_s, s.measured_s) for n, s in msg.stages.items()})
        if drift is not None and self.drifted.empty():
            self.drifted.put_nowait(drift)

    def _on_chat_evt(self, j: Joined, msg: messages.ChatEvt) -> None:
        if self.forwarder is not None:
            self.forwarder.deliver(msg)

    async def _send_chunks(self, j: Joined, chunks: list[int]) -> None:
        assert j.manifest is not None and j.stage_path is not None
        name, total = j.peer.name, j.manifest.size
        done = total - len(chunks) * j.manifest.chunk_size

        def progress(n: int) -> None:
            nonlocal done
            done += n
            j.progress_at = asyncio.get_running_loop().time()
            j.step = "receiving its stage"
            self.state.delivery[name] = (min(max(done, 0), total), total)
            self.state.changed()

        try:
            sent_bytes = await send_stage(j.link, j.stage_path, j.manifest, chunks, progress)
        except NetworkError as exc:  # the member is gone: a loss like any other, the epoch re-plans
            log.info("stopped sending %s its stage: %s", name, exc)
            self.lost.put_nowait((name, str(exc)))
            return
        self.state.delivery[name] = (total, total)
        self.state.log(f"stage delivered to {j.peer.name}: {sent_bytes} bytes sent")

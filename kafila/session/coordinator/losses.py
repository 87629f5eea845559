"""What the coordinator does when a member is lost: the epoch ends, the lost member's requests fail (the API
servers resume them), every other member hears of it, and the survivors are planned again (a new epoch)
when re-planning is on and anyone is left.

A member is lost when its link to the coordinator fails, when it makes no progress for the stall limit
(epochs._wait_all), when it reports itself lost, or when a ring neighbour reports it and the coordinator's own
link confirms it (loss_reports.py); a report of an epoch already given up is stale. A report the coordinator's
link does not confirm evicts nobody: the epoch ends and everyone is planned again.
"""

from __future__ import annotations

import asyncio
import contextlib

from kafila.errors import KafilaError
from kafila.session.coordinator.core import CoordinatorCore, Joined, log
from kafila.session.coordinator.loss_reports import Action, Evict, Probe
from kafila.session.protocol import messages


class LossHandling(CoordinatorCore):
    """The coordinator's losses: reported, awaited, and handled."""

    def _on_lost_report(self, j: Joined, msg: messages.Lost) -> None:
        # Only the member named or its ring neighbours get here (protocol.authority). A report of an epoch
        # already given up is stale: when a member stops serving on the coordinator's word it closes its ring
        # edges, and a neighbour still serving reports it lost, alive as it is. A member truly gone is lost on
        # its own link to the coordinator too (_recv_loop), so none is missed.
        if msg.epoch != self.epoch or self._replanning:
            log.info("ignored %s's stale report of epoch %d: %s lost (%s)", j.peer.name, msg.epoch, msg.who, msg.reason)
            return
        self._act(self.reports.report(j.peer.name, msg.who, msg.reason))

    def _act(self, actions: list[Action]) -> None:
        """Carry out what the loss reports' machine says (coordinator.loss_reports)."""
        for action in actions:
            if isinstance(action, Evict):
                if action.confirmed:
                    self.state.log(f"{action.who} is lost: {action.confirmed}")
                self.lost.put_nowait((action.who, action.reason))
            elif isinstance(action, Probe):
                self._tg.create_task(self._probe(action.who))
            else:
                self.state.log(action.reason)
                self.broken.put_nowait(action.reason)

    async def _probe(self, who: str) -> None:
        """Ping `who` on this coordinator's own link, bounded by the link's idle timeout (a silent peer's end)."""
        bound = self.opts.link_idle_timeout_s
        j = self.joined.get(who)
        if j is not None and await j.link.ping(bound):
            self._act(self.reports.answered(who))
        elif j is None or j.link.closed is not None:
            self._act(self.reports.unanswered(who, "its link to the coordinator is down"))
        else:
            self._act(self.reports.unanswered(who, f"it did not answer the coordinator's ping within {bound:g} s"))

    async def _next_break(self) -> tuple[str | None, str]:
        """The next loss (who, why), or (None, why) when a ring broke though everyone in it answers."""
        loss = asyncio.ensure_future(self._next_loss())
        broken = asyncio.ensure_future(self.broken.get())
        try:
            await asyncio.wait({loss, broken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (loss, broken):
                f.cancel()
        if loss.done() and not loss.cancelled():  # a loss first: the plan must do without the member anyway
            return loss.result()
        return None, broken.result()

    async def _next_loss(self) -> tuple[str, str]:
        """The next loss of a member still in the session (a late report of an earlier loss is no news).

        A member waiting for the next plan (one that rejoined while the ring served) is dropped without a
        re-plan: the ring serving lost nothing.
        """
        while True:
            who, reason = await self.lost.get()
            if who in self.joined and self.order and who not in self.order and self.state.phase == "admitted":
                waiting = self.joined.pop(who)
                self.held.discard(who)
                self.departed.add(who)
                self.state.update_member(who, status="lost", note=reason)
                self.state.log(f"{who}, waiting for the next plan, left: {reason}")
                with contextlib.suppress(KafilaError):
                    await waiting.link.close()
                continue
            if who in self.joined:
                return who, reason

    async def _on_lost(self, who: str, reason: str) -> int | None:
        """End this epoch over `who`'s loss: None to plan again over the others, else the exit status."""
        self._replanning = True  # this epoch is over: its members' reports from now on are stale
        self.state.lost = f"{who}: {reason}"
        self.state.update_member(who, status="lost", note=reason)
        self.state.set_phase("lost", f"member {who} was lost: {reason}")
        if self.forwarder is not None:
            self.forwarder.fail_all(f"member {who} was lost: {reason}", lost=who)
        if self.api is not None:
            self.api.chat = None
        for j in self.joined.values():  # chunks of this epoch's stages must not reach the next epoch
            for task in list(j.sending):
                task.cancel()
        gone = self.joined.pop(who, None)
        self.departed.add(who)
        if gone is not None:
            with contextlib.suppress(KafilaError):
                await gone.link.close()
        for name in list(self.joined):
            await self._tell(name, messages.Lost(who, reason, self.epoch))
        # the same loss is often reported by its neighbours and by its own link: keep other losses only
        others = [self.lost.get_nowait() for _ in range(self.lost.qsize())]
        for other in others:
            if other[0] != who and other[0] in self.joined:
                self.lost.put_nowait(other)
        if not self.settings.replan or not self.joined:
            return 1
        self.state.log("planning again over the remaining members")
        return None

"""Members arriving at the coordinator: each is admitted to the session or refused (another llama.cpp build,
another model file, a name taken), and the coordinator waits until enough have come.

A member that comes after the first plan (a friend arriving late, or a lost member's restarted machine) is
held: the coordinator plans it in when that cuts the slowest stage enough (epochs._until_change), then or
at any later plan (epochs._plan_over).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets

from kafila.errors import KafilaError, SessionError
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.session.coordinator.builds import judge_member
from kafila.session.coordinator.core import CoordinatorCore, Joined
from kafila.session.coordinator.epochs import GAIN, planner_member
from kafila.session.delivery.local_model import MODEL_KEY, judge_model, model_proof
from kafila.session.protocol import messages
from kafila.session.state import member_view


def unusable_measurements(peer: VerifiedMember) -> str | None:
    """Why a member's announced measurements cannot be planned with (missing, NaN, negative), or None."""
    try:
        planner_member(peer)
    except SessionError as exc:
        return str(exc)
    return None


PROOF_TIMEOUT_S = 10.0  # a member that does not answer its model proof by then is refused


class Admission(CoordinatorCore):
    """The coordinator's door: who joins the session, and waiting for them."""

    async def _model_refusal(self, peer: VerifiedMember, link: Link) -> str | None:
        """Why a member's own model file (join --model) is refused: None when it has none, or it is the host's
        and the member proves it holds it (a holder cuts its own stages and can become the heir)."""
        if MODEL_KEY not in peer.measurements:
            return None
        if self._model_sha256 is None:
            self._model_sha256 = await asyncio.to_thread(self.cache.source_hash, self.model)
        refusal = judge_model(self._model_sha256, peer.name, peer.measurements)
        if refusal is not None:
            return refusal
        nonce = secrets.token_bytes(32)
        expected = asyncio.create_task(asyncio.to_thread(model_proof, self.model, nonce))
        why = "its proof does not match the host's file"
        try:
            await link.send(messages.encode(messages.Prove(nonce.hex())))
            answer = messages.decode(await link.recv(timeout=PROOF_TIMEOUT_S))
            if isinstance(answer, messages.Proof) and hmac.compare_digest(answer.digest, await expected):
                return None
        except (KafilaError, TimeoutError) as exc:
            why = str(exc)[:120]
        finally:
            expected.cancel()
        return (f"{peer.name} announced the host's model hash but did not prove it holds the file (pieces of it "
                f"the host chose): {why}")

    async def _accept_loop(self) -> None:
        while True:
            try:
                link = await self.ep.accept(timeout_s=3600)
            except TimeoutError:
                continue
            peer = link.peer
            view = member_view(peer)
            verdict = judge_member(self.my_build, peer.measurements, self.opts.mixed_builds)
            refusal = verdict.reason if not verdict.admitted else \
                unusable_measurements(peer) or await self._model_refusal(peer, link)
            if refusal is not None:
                reason = refusal
                view.status, view.note = "refused", reason
                self.state.upsert_member(view)
                self.state.log(f"refused {peer.name}: {reason}")
                with contextlib.suppress(KafilaError):
                    await link.send(messages.encode(messages.Refused(reason)))
                continue
            if peer.name in self.joined:
                with contextlib.suppress(KafilaError):
                    await link.send(messages.encode(messages.Refused(
                        "a member of that name is already in the session (join with another --name)")))
                continue
            self.joined[peer.name] = Joined(peer, link)
            self.builds.add(peer.name, verdict)
            came = "rejoined" if peer.name in self.departed else "joined"
            self.departed.discard(peer.name)
            if self.state.plan is None:
                self.state.log(f"{peer.name} {came} ({len(self.joined)}/{self.expected})")
            else:  # after the first plan: held until a plan takes it in
                view.note = f"{came} after planning: planned in when that cuts the slowest stage"
                self.state.log(f"{peer.name} {came} the session; planned in when that cuts the slowest stage by "
                               f"{GAIN:.0%}, now or at a later plan")
                self.held.add(peer.name)
                self.arrivals.put_nowait(peer.name)
            self.state.upsert_member(view)
            self._tg.create_task(self._recv_loop(peer.name, link))
            self._arrived.set()

    @property
    def expected(self) -> int:
        """How many members to wait for: those asked for, and the host's own machine unless it only coordinates."""
        return self.opts.members + (0 if self.opts.coordinate_only else 1)

    async def _wait_for_members(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.wait_s
        while len(self.joined) < self.expected:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - loop.time()))
            if loop.time() >= deadline:
                break
        if not self.joined:
            raise SessionError(f"no member joined within {self.opts.wait_s:.0f} s")

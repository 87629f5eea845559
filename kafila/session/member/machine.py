"""A member's decisions, sans-I/O: what each of its coordinator's messages asks of it, and whom it follows once
that coordinator is gone. The member's shell (runtime.py) feeds it and carries out the effects it returns.

    handle(sender, msg)              the coordinator's message, on its link; who may send it is checked first
    without_coordinator(why, serving) Follow (a successor, maybe this member) | ServeOn | End

The takeover's rule (takeover.py's docstring): every member makes the same choice from the same replicated
roster and assignment, the first survivor in ring order holding the model; no word is exchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kafila.errors import SessionError
from kafila.session.member.takeover import successor
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, Via, refusal
from kafila.session.state import SessionState

log = logging.getLogger("kafila.member")


@dataclass(frozen=True)
class Stop:
    """Stop serving: the requests in flight end, resumable, naming `reason` (and the member `lost`)."""

    reason: str
    lost: str | None = None


@dataclass(frozen=True)
class Follow:
    """The coordinator is gone: follow `heir` (this member, maybe), which re-plans or (`adopt`) takes the ring over."""

    heir: str
    adopt: bool
    left: str


@dataclass(frozen=True)
class ServeOn:
    """The coordinator is gone and nobody can take over: the ring serves on until it breaks."""

    left: str


@dataclass(frozen=True)
class End:
    """The session ends for this member: `status`, or (None) the error `why`."""

    status: int | None
    why: str = ""


# the coordinator's instructions the shell carries out as they came, and what the machine decided
Instruction = messages.Assign | messages.Connect | messages.Admit | messages.Chat | messages.Prove | messages.Copy
Effect = Instruction | Stop | End


class Follower:
    """What a member knows of its session: its assignment, the coordinator's replicated roster, and how it ended."""

    def __init__(self, me: str, state: SessionState) -> None:
        self.me, self.state = me, state
        self.assignment: messages.Assign | None = None
        self.roster: messages.Roster | None = None  # the coordinator's replicated state
        self.ended: str | None = None  # why the session cannot go on, as a ring neighbour said it
        self.heirs: set[str] = set()  # members that took coordination over: a failed takeover is not retried

    def handle(self, sender: str, msg: messages.Control) -> list[Effect]:
        """The coordinator's message on its link; a reject or refusal raises SessionError."""
        refused = refusal(Sender(sender, Via.COORDINATOR), msg, RingView())
        if refused is not None:  # never handled (protocol.authority)
            log.warning("refused %s", refused)
            return []
        handler: Callable[[messages.Control], list[Effect]] | None = getattr(self, f"_on_{msg.T}", None)
        if handler is None:
            log.warning("ignored a %r message from the host", msg.T)
            return []
        return handler(msg)

    def _on_assign(self, msg: messages.Assign) -> list[Effect]:
        """Stop serving, then receive (or cut) this stage and load it; `connect`: open the ring edges; `admit`:
        serve; `chat`: a request of the coordinator's API, for the head; `prove`: show the coordinator this
        member holds the model file it announced; `copy`: receive a copy of the model in the background."""
        return [msg]

    _on_connect = _on_admit = _on_chat = _on_prove = _on_copy = _on_assign

    def _on_reject(self, msg: messages.Reject | messages.Refused) -> list[Effect]:
        self.state.rejection = msg.reason
        self.state.set_phase("rejected", f"{msg.T}: {msg.reason}")
        raise SessionError(f"the session was {'rejected' if msg.T == 'reject' else 'refused'}: {msg.reason}")

    _on_refused = _on_reject

    def _on_lost(self, msg: messages.Lost) -> list[Effect]:
        return [Stop(f"member {msg.who} was lost: {msg.reason}", lost=msg.who)]

    def _on_replan(self, msg: messages.Replan) -> list[Effect]:
        return [Stop(f"the ring is planned again: {msg.reason}")]

    def _on_roster(self, msg: messages.Roster) -> list[Effect]:
        """Kept, so that this member knows the ring without its host."""
        self.roster = msg
        self.state.coordinator = self.state.coordinator or msg.coordinator
        for name, m in msg.members.items():
            self.state.update_member(name, bandwidth_bytes_per_s=m.bw, dispatch_s=m.disp, memory_bytes=m.mem,
                                     nat=m.nat, rtt_ms=m.rtt_ms)
        return []

    def _on_bye(self, msg: messages.Bye) -> list[Effect]:
        self.state.set_phase("closed", f"the host closed the session: {msg.reason}")
        return [End(0)]

    def without_coordinator(self, reason: str, serving: bool) -> Follow | ServeOn | End:
        """Whom to follow now that the coordinator left (`serving`: this member's ring still serves).

        When the coordinator's process held a stage, the successor re-plans over the survivors; when it held
        none and the ring still serves, it takes the ring over as it is. With no survivor holding the model the
        ring serves on under the head until a later loss ends the session (re-planning needs the model's bytes).
        """
        left = f"the coordinator ({self.state.coordinator or 'the host'}) left the session: {reason}"
        self.state.coordinator_left = left
        roster, assignment = self.roster, self.assignment
        if roster is not None and assignment is not None and self.ended is None:
            heir = successor(roster, assignment.order)
            if heir is not None and heir not in self.heirs and (roster.beside in assignment.order or serving):
                self.heirs.add(heir)
                self.state.coordinator = heir
                return Follow(heir, roster.beside not in assignment.order, left)
        if assignment is not None and serving:
            self.state.coordinator = assignment.head
            self.state.log(f"{left}; the ring serves on, and {assignment.head} (the head) coordinates now")
            return ServeOn(left)
        return End(None, self.why_ended(left, served=False))

    def why_ended(self, left: str, served: bool) -> str:
        """Why the session cannot go on, once the coordinator `left` (and, `served`, the ring broke after)."""
        if self.ended is not None:
            return self.ended  # the first member to end said why; every member says the same
        if served:
            why = f"{self.state.lost or 'the ring broke'}, after {left}"
        elif self.state.lost is not None:
            why = f"{self.state.lost}, and {left}"
        else:
            why = f"{left} before the ring was admitted"
        if self.assignment is not None:
            why += ("; the ring cannot be re-planned without its host: no survivor holds the model to cut new "
                    "stages from (a member joined with `kafila join CODE --model PATH` would have taken "
                    "coordination over, as would the one the host copies the model to once its copy is whole, "
                    "unless the host ran with --no-copy): open a new session with `kafila host`")
        return why

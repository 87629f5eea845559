"""Who may send each control message: one table (SENDERS), checked by `refusal` before any handler runs.

A message's sender is the link it came on, never a field it declares: every link is QUIC pinned to the
certificate fingerprint a verified announcement (or the coordinator's assignment) named, so its peer's
name is authenticated. How the link relates to the receiver (`Via`) and the ring serving now (`RingView`)
decide which roles the sender holds:

    coordinator   the receiver's link to its coordinator (a member found it by its certificate,
                  kafila.net.mandate)
    head          an admitted member's link, that member the head of the ring serving now
    neighbour     an admitted member's link, that member a ring neighbour of the member the message names
                  (`lost.who`), or that member itself (its own stage failed: it leaves)
    member        any admitted member's link
    code holder   a link before admission: its announcement carried the join code's MAC, nothing more
    predecessor   the ring edge from the member before the receiver in ring order; a `chat` on it must
                  name as its origin that member or one whose chats it relays (those after the head, up to
                  it): the origin decides whose prompt cache a request may reuse

Where it is checked: the coordinator's machine for admitted members and its wait for an arrival's
measurements (kafila.session.coordinator.machine, admission), the member's loop over its control link
(member.machine) and its ring edge's inbox (member.serving for a stage, ring.head for the head). A refused
message is logged with its sender and kind and never handled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from kafila.session.protocol import messages


class Via(Enum):
    """Which of the receiver's links a message came on."""

    COORDINATOR = "the coordinator's link"
    MEMBER = "an admitted member's link"
    ARRIVAL = "the link of a member not admitted yet"
    RING = "the ring edge from the previous member"


class Role(Enum):
    """Who may send a kind of message (see the module's docstring)."""

    COORDINATOR = "the coordinator"
    HEAD = "the ring's head"
    NEIGHBOUR = "a ring neighbour of the member it names"
    MEMBER = "an admitted member"
    CODE_HOLDER = "a member not admitted yet"
    PREDECESSOR = "the previous ring member"


@dataclass(frozen=True)
class Sender:
    """An authenticated sender: its link's peer name, and which of the receiver's links that is."""

    name: str
    via: Via


@dataclass(frozen=True)
class RingView:
    """What the receiver knows of the ring: `order` serving now (head first; () before the first admission),
    the admitted `members` (the coordinator's), and the receiver's own name `me` (a member's)."""

    order: tuple[str, ...] = ()
    members: frozenset[str] = frozenset()
    me: str | None = None


C, H, N, M, A, P = Role.COORDINATOR, Role.HEAD, Role.NEIGHBOUR, Role.MEMBER, Role.CODE_HOLDER, Role.PREDECESSOR

# Every control message kind (messages.SCHEMA) and who may send it.
SENDERS: dict[str, frozenset[Role]] = {
    "assign": frozenset({C}), "connect": frozenset({C}), "admit": frozenset({C}), "reject": frozenset({C}),
    "refused": frozenset({C}), "replan": frozenset({C}), "roster": frozenset({C}), "copy": frozenset({C}),
    "prove": frozenset({C}),
    "need": frozenset({M}), "working": frozenset({M}), "loaded": frozenset({M}), "ready": frozenset({M}),
    "copy_need": frozenset({M}), "copied": frozenset({M}),
    "measuring": frozenset({A}), "measured": frozenset({A}), "proof": frozenset({A}),
    "lost": frozenset({C, N}),  # the coordinator's word, or a report it confirms (coordinator.loss_reports)
    "stats": frozenset({H}),
    "chat_evt": frozenset({H, P}),  # the head's answer: to the coordinator, or along the ring
    "chat": frozenset({C, P}),  # the coordinator's API's request to the head, or one along the ring
    "free": frozenset({P}), "trim": frozenset({P}), "fork": frozenset({P}),
    "bye": frozenset({C, M, A, P}),
}


def ring_neighbours(order: Sequence[str], who: str) -> frozenset[str]:
    """The members either side of `who` in the ring `order` (empty when it is not in it, or alone)."""
    if who not in order:
        return frozenset()
    i = order.index(who)
    return frozenset({order[i - 1], order[(i + 1) % len(order)]}) - {who}


def relayed_by(order: Sequence[str], sender: str) -> frozenset[str]:
    """The origins a chat may carry on the ring edge from `sender`: its own and those it relays toward the
    head (each member after the head sends its chats to the next; the head's go nowhere)."""
    if sender not in order[1:]:
        return frozenset()
    return frozenset(order[1:order.index(sender) + 1])


def _holds(role: Role, sender: Sender, msg: messages.Control, view: RingView) -> bool:
    if role is Role.COORDINATOR:
        return sender.via is Via.COORDINATOR
    if role is Role.CODE_HOLDER:
        return sender.via is Via.ARRIVAL
    if role is Role.PREDECESSOR:
        if sender.via is not Via.RING or view.me not in view.order:
            return False
        before = view.order[view.order.index(view.me) - 1]
        return sender.name == before and (not isinstance(msg, messages.Chat)
                                          or msg.origin in relayed_by(view.order, sender.name))
    if sender.via is not Via.MEMBER or sender.name not in view.members:
        return False
    if role is Role.HEAD:
        return bool(view.order) and sender.name == view.order[0]
    if role is Role.NEIGHBOUR:
        who = getattr(msg, "who", None)
        return who is not None and who in view.order and (
            sender.name == who or sender.name in ring_neighbours(view.order, who))
    return True  # Role.MEMBER


def refusal(sender: Sender, msg: messages.Control, view: RingView) -> str | None:
    """Why `sender` may not send `msg` to a receiver that sees the ring as `view`; None when it may."""
    roles = SENDERS.get(msg.T, frozenset())
    if any(_holds(role, sender, msg, view) for role in roles):
        return None
    allowed = " or ".join(sorted(r.value for r in roles)) or "nobody"
    extra = f" (origin {msg.origin!r})" if isinstance(msg, messages.Chat) and Role.PREDECESSOR in roles else ""
    return f"a {msg.T!r} message{extra} from {sender.name} on {sender.via.value}: only {allowed} may send it"


def chat_owner(sender: Sender, msg: messages.Chat) -> str:
    """Whose prompt cache a chat may reuse: its link's, never its declared origin alone. Over the control
    link it is the coordinator's API; on the ring the origin `refusal` checked against the edge it came on."""
    if sender.via is Via.COORDINATOR:
        return f"coordinator:{sender.name}"
    return f"ring:{msg.origin}"

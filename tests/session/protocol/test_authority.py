"""The authority table (issue 55, item 4): every control message kind allowed from whom it names, refused from
everyone else; the roles worked out on a ring of five; a chat's owner taken from its link."""

from __future__ import annotations

from typing import Any

import pytest

from kafila.session.protocol import messages
from kafila.session.protocol.authority import (
    SENDERS,
    RingView,
    Role,
    Sender,
    Via,
    chat_owner,
    refusal,
    relayed_by,
    ring_neighbours,
)
from kafila.session.protocol.manifest import StageManifest
from tests.session.scripted import SETTINGS

pytestmark = pytest.mark.fast

ORDER = ("hd", "m1", "m2", "m3", "m4")  # head first: hd → m1 → m2 → m3 → m4 → hd
COORDINATOR_SIDE = RingView(ORDER, frozenset(ORDER) | {"held"})  # "held": admitted, in no ring
MANIFEST = StageManifest("a" * 64, 10, 1 << 20, ("b" * 64,))

# one message of every kind; lost names m2 (neighbours m1 and m3), a chat is m2's
SAMPLES: dict[str, messages.Control] = {
    "assign": messages.Assign(epoch=1, order=("hd",), head="hd", ranges={"hd": (0, 4)}, settings=SETTINGS, plan={},
                              model="m", stage=MANIFEST, fingerprints={"hd": "f" * 64}),
    "need": messages.Need(1, ()), "working": messages.Working(1, "x"), "loaded": messages.Loaded(1),
    "connect": messages.Connect(1), "ready": messages.Ready(1, None), "admit": messages.Admit(1),
    "reject": messages.Reject("r"), "refused": messages.Refused("r"),
    "measuring": messages.Measuring("x", 0, False, 0.0), "measured": messages.MeasuredSelf({}),
    "lost": messages.Lost("m2", "r", 1), "replan": messages.Replan("r", 1),
    "stats": messages.Stats({}, None, None), "free": messages.Free(0), "trim": messages.Trim(0, 1),
    "fork": messages.Fork(0, 1, 2),
    "chat": messages.Chat("m2-0", "m2", {}), "chat_evt": messages.ChatEvt("m2-0", "m2", {"notice": "n"}),
    "roster": messages.Roster("hd", "m", {}), "bye": messages.Bye("r"),
    "copy": messages.Copy(MANIFEST), "copy_need": messages.CopyNeed(()), "copied": messages.Copied(None, "e"),
    "prove": messages.Prove("0" * 64), "proof": messages.Proof("0" * 64),
}

# a sender holding each role (with the view it is judged in) for the samples above, and one holding none of them
HOLDER: dict[Role, tuple[Sender, RingView]] = {
    Role.COORDINATOR: (Sender("boss", Via.COORDINATOR), RingView()),
    Role.HEAD: (Sender("hd", Via.MEMBER), COORDINATOR_SIDE),
    Role.NEIGHBOUR: (Sender("m3", Via.MEMBER), COORDINATOR_SIDE),
    Role.MEMBER: (Sender("held", Via.MEMBER), COORDINATOR_SIDE),
    Role.CODE_HOLDER: (Sender("newcomer", Via.ARRIVAL), RingView()),
    Role.PREDECESSOR: (Sender("m3", Via.RING), RingView(ORDER, me="m4")),
}
ALSO = {Role.HEAD: Role.MEMBER, Role.NEIGHBOUR: Role.MEMBER}  # the head and a neighbour are members too
# senders that hold none of the roles for any sample: each kind is refused from every one of them
OUTSIDERS: list[tuple[Sender, RingView]] = [
    (Sender("m4", Via.RING), RingView(ORDER, me="m4")),  # its own name on the edge in: not its predecessor
    (Sender("hd", Via.RING), RingView(ORDER, me="m2")),  # a ring member, not the one before m2
    (Sender("stranger", Via.MEMBER), COORDINATOR_SIDE),  # not admitted
    (Sender("m4", Via.RING), RingView(("m4",), me="gone")),  # a receiver no longer in the ring
]


def test_the_table_names_every_kind_of_control_message() -> None:
    assert set(SENDERS) == set(messages.SCHEMA) == set(SAMPLES)
    assert all(SENDERS.values())


@pytest.mark.parametrize("kind", sorted(SENDERS))
def test_each_kind_is_allowed_from_whom_the_table_names_and_refused_from_the_others(kind: str) -> None:
    msg = SAMPLES[kind]
    for role, (sender, view) in HOLDER.items():
        why = refusal(sender, msg, view)
        if role in SENDERS[kind] or ALSO.get(role) in SENDERS[kind]:
            assert why is None, (role, why)
        else:
            assert why is not None and repr(kind) in why and sender.name in why, (role, kind)
    for sender, view in OUTSIDERS:
        assert refusal(sender, msg, view) is not None, (sender, view, kind)


@pytest.mark.parametrize(("reporter", "allowed"), [
    ("m1", True), ("m3", True), ("m2", True),  # its neighbours, and itself (its stage failed: it leaves)
    ("hd", False), ("m4", False), ("held", False), ("stranger", False),
])
def test_a_loss_report_counts_only_from_the_member_named_or_its_ring_neighbours(reporter: str, allowed: bool) -> None:
    why = refusal(Sender(reporter, Via.MEMBER), messages.Lost("m2", "r", 1), COORDINATOR_SIDE)
    assert (why is None) == allowed, why


def test_a_report_about_a_member_in_no_ring_counts_from_nobody_but_the_coordinator() -> None:
    for sender in ORDER:
        assert refusal(Sender(sender, Via.MEMBER), messages.Lost("held", "r", 1), COORDINATOR_SIDE) is not None
    assert refusal(Sender("boss", Via.COORDINATOR), messages.Lost("held", "r", 1), RingView()) is None


@pytest.mark.parametrize("sender", ["m1", "m2", "m3", "m4", "held"])
def test_only_the_head_sends_the_coordinator_stats_and_chat_events(sender: str) -> None:
    for msg in (SAMPLES["stats"], SAMPLES["chat_evt"]):
        assert refusal(Sender(sender, Via.MEMBER), msg, COORDINATOR_SIDE) is not None
        assert refusal(Sender("hd", Via.MEMBER), msg, COORDINATOR_SIDE) is None
    assert refusal(Sender("hd", Via.MEMBER), SAMPLES["stats"], RingView((), frozenset({"hd"}))) is not None


@pytest.mark.parametrize(("me", "origin", "allowed"), [
    ("m3", "m2", True), ("m3", "m1", True), ("m3", "m3", False), ("m3", "m4", False), ("m3", "hd", False),
    ("hd", "m4", True), ("hd", "m1", True), ("hd", "hd", False), ("m1", "hd", False), ("m3", "", False),
])
def test_a_chat_on_the_ring_carries_its_senders_origin_or_one_it_relays(me: str, origin: str, allowed: bool) -> None:
    """Chats go from a member toward the head: the edge into `me` brings those of the members from the head's
    successor up to `me`'s predecessor, and no one else's."""
    before = ORDER[ORDER.index(me) - 1]
    msg = messages.Chat(f"{origin}-0", origin, {})
    assert (refusal(Sender(before, Via.RING), msg, RingView(ORDER, me=me)) is None) == allowed


def test_a_chat_is_owned_by_its_link_not_by_what_it_declares() -> None:
    forged = messages.Chat("x-0", "m2", {})
    assert chat_owner(Sender("boss", Via.COORDINATOR), forged) == "coordinator:boss"
    assert chat_owner(Sender("m2", Via.RING), forged) == "ring:m2"
    assert chat_owner(Sender("boss", Via.COORDINATOR), forged) != chat_owner(Sender("m2", Via.RING), forged)


def test_neighbours_and_relays_brute_force_against_their_definitions() -> None:
    for n in range(1, 7):
        order = tuple(f"n{i}" for i in range(n))
        for i, who in enumerate(order):
            expected: set[Any] = {order[(i - 1) % n], order[(i + 1) % n]} - {who}
            assert ring_neighbours(order, who) == expected
            # the members whose chats pass the edge out of `who`: those from the head's successor to `who`
            assert relayed_by(order, who) == ({order[j] for j in range(1, i + 1)} if i else set())
        assert ring_neighbours(order, "absent") == frozenset() == relayed_by(order, "absent")

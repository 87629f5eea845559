"""The member's machine in memory (member/machine.py): what the coordinator's messages ask, who may send them, and
whom a member follows once its coordinator is gone. The process-level takeover tests stay (test_takeover.py);
these reach each choice at once."""

from __future__ import annotations

import pytest

from kafila.errors import SessionError
from kafila.session.member import machine as mx
from kafila.session.member.machine import Follower
from kafila.session.protocol import messages
from kafila.session.protocol.manifest import StageManifest
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState

pytestmark = pytest.mark.fast

STAGE = StageManifest("0" * 64, 1, 1 << 20, ("0" * 64,))
SETTINGS = SessionSettings(speculate="off", copy=False, stall_s=33.0)


def assign(order: tuple[str, ...], epoch: int = 3) -> messages.Assign:
    return messages.Assign(epoch=epoch, order=order, head=order[0], ranges={n: (i, i + 1) for i, n in enumerate(order)},
                           settings=SETTINGS, plan={}, model="m", stage=STAGE)


def roster(beside: str | None, holders: tuple[str, ...]) -> messages.Roster:
    return messages.Roster("host", "m", {}, beside, holders)


def follower(me: str, order: tuple[str, ...], beside: str | None, holders: tuple[str, ...]) -> Follower:
    f = Follower(me, SessionState(role="member", me=me, phase="waiting"))
    assert f.handle("host", assign(order)) == [assign(order)]
    assert f.handle("host", roster(beside, holders)) == []
    f.assignment = assign(order)  # the shell keeps it once the stage is set up
    return f


def test_each_message_asks_for_one_thing_and_a_reject_ends_the_session() -> None:
    f = Follower("ada", SessionState(role="member", me="ada", phase="connecting"))
    assert f.handle("host", messages.Connect(3)) == [messages.Connect(3)]
    assert f.handle("host", messages.Admit(3)) == [messages.Admit(3)]
    assert f.handle("host", messages.Lost("bo", "gone", 3)) == [mx.Stop("member bo was lost: gone", lost="bo")]
    assert f.handle("host", messages.Replan("bo drifts", 3)) == [mx.Stop("the ring is planned again: bo drifts")]
    with pytest.raises(SessionError, match="the session was refused: a name taken"):
        f.handle("host", messages.Refused("a name taken"))
    assert f.state.phase == "rejected"


def test_the_host_surviving_a_stage_loss_is_followed_by_the_first_holder_in_ring_order() -> None:
    # the host's own member (bo) held a stage: the first other holder in ring order re-plans over the survivors
    for me in ("ada", "cy", "dan"):
        f = follower(me, ("ada", "bo", "cy", "dan"), beside="bo", holders=("bo", "dan", "cy"))
        step = f.without_coordinator("link down", serving=False)
        assert step == mx.Follow("cy", adopt=False, left=f.state.coordinator_left)
        assert f.state.coordinator == "cy"
        assert f.without_coordinator("cy is gone too", serving=False) != step  # a failed takeover is not retried


def test_a_coordinate_only_host_lost_hands_the_serving_ring_over_as_it_is() -> None:
    f = follower("ada", ("ada", "bo", "cy"), beside=None, holders=("cy",))
    step = f.without_coordinator("link down", serving=True)
    assert isinstance(step, mx.Follow) and step.heir == "cy" and step.adopt
    assert isinstance(follower("ada", ("ada", "bo", "cy"), None, ("cy",)).without_coordinator("x", serving=False),
                      mx.End)  # not serving and nothing lost with the host: nobody takes an unserved ring over


def test_without_a_holder_the_ring_serves_on_then_the_session_ends_saying_why() -> None:
    f = follower("bo", ("ada", "bo", "cy"), beside="host", holders=())
    step = f.without_coordinator("link down", serving=True)
    assert step == mx.ServeOn(f.state.coordinator_left or "") and f.state.coordinator == "ada"  # the head
    f.state.lost = "cy lost: its ring edge failed"
    why = f.why_ended(step.left, served=True)
    assert why.startswith("cy lost: its ring edge failed, after the coordinator") and "no survivor holds" in why
    f.ended = "the first member to end said so"
    assert f.why_ended(step.left, served=True) == "the first member to end said so"


def test_only_the_coordinators_link_may_instruct_a_member() -> None:
    f = Follower("ada", SessionState(role="member", me="ada", phase="waiting"))
    assert f.handle("host", messages.Loaded(3)) == []  # a member's message, not the coordinator's: refused
    assert f.handle("host", messages.Stats({}, None, None)) == []

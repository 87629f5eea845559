"""The coordinator while its members open the ring's edges, and the loss reports that follow.

The real coordinator (HostRuntime: planner, stage cuts of a tiny synthetic model, its control messages) runs
here with scripted members over real QUIC links (tests/session/scripted.py). Each member holds its stage
at once; what it does when told to `connect` is the test's:

- a member reports that its ring edge from its predecessor could not open: the coordinator checks that
  predecessor on its own link; gone, it is lost, the epoch ends, and the others are planned again (a new
  epoch, admitted without it); there, nobody is evicted and everyone is planned again;
- a member that says nothing at all once told to connect is lost after the stall limit, named with what it
  was doing, and the others are planned again; one that keeps saying it is working is waited for;
- reports of an epoch already given up, and of a member already handled, change nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafila.session.protocol import messages
from tests.session.scripted import Coordinated, OnConnect, ScriptedMember, coordinator, silence
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast

NAMES = ["ada", "bo", "cy"]
# The text a member sends when its predecessor never connected (kafila.session.member.stage._report_edge_failure)
EDGE_FAILED = "its ring edge could not open: predecessor {who} did not connect within 15 s"
STALL_S = 2.0  # the stall limit of the stall tests: the clock they test
REPORTER_STALL_S = 10.0


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_synthetic(tmp_path / "tiny.gguf", "llama", n_blocks=6)


def reports_its_predecessor(victim: str, dies: bool = True) -> OnConnect:
    """On `connect` of epoch 1: the member whose predecessor is `victim` reports its incoming edge failed; the
    victim goes silent as a killed process does (unless not `dies`); the others, and every later epoch, ready."""
    async def on_connect(m: ScriptedMember, msg: messages.Connect) -> None:
        if m.name == victim and dies and msg.epoch == 1:
            silence(m.ep)
        elif m.predecessor(msg.epoch) == victim and msg.epoch == 1:
            await m.send(messages.Lost(victim, EDGE_FAILED.format(who=victim), msg.epoch))
        else:
            await m.send(messages.Ready(msg.epoch, None))
    return on_connect


def assert_lost_then_replanned(c: Coordinated, victim: str, reason: str | None = None) -> str:
    """`victim` was lost in epoch 1 (for `reason`, when given); every other member heard so before its
    assignment of epoch 2. The reason it was lost for."""
    order = c.runtime.machine.order
    assert order and sorted(order) == sorted(n for n in NAMES if n != victim), c.log()
    assert victim not in c.runtime.machine.peers and victim in c.runtime.machine.departed
    view = c.state.members[victim]
    reason = view.note if reason is None else reason
    assert (view.status, view.note) == ("lost", reason)
    for name in c.runtime.machine.order:
        got = c.members[name].inbox.got
        lost = [i for i, m in enumerate(got) if isinstance(m, messages.Lost)]
        replan = next(i for i, m in enumerate(got) if isinstance(m, messages.Assign) and m.epoch == 2)
        assert [got[i] for i in lost] == [messages.Lost(victim, reason, 1)], got
        assert lost[0] < replan
        assert list(c.members[name].order(2)) == c.runtime.machine.order
    return reason


async def test_a_ring_edge_that_cannot_open_loses_its_far_end_and_the_ring_is_planned_again(
        tmp_path: Path, model: Path) -> None:
    """cy goes silent as a killed process does, and its successor reports the edge from it failed: the
    coordinator's own link confirms it (its ping goes unanswered, or the link ends), so cy is lost. The member
    that reported is silent after its report, as a real one is: were the report and the link both ignored,
    the coordinator would lose the reporter at the stall limit instead (REPORTER_STALL_S: no clock this test
    waits for, only a bound that makes a broken coordinator fail fast)."""
    victim = "cy"
    behaviour = reports_its_predecessor(victim)
    async with coordinator(tmp_path, model, NAMES, stall_s=REPORTER_STALL_S,
                           on_connect=dict.fromkeys(NAMES, behaviour)) as c:
        epoch = await c.reach("admitted")
        assert epoch == 2, f"admitted in epoch {epoch}, the failed edge's report ignored:\n{c.log()}"
        reason = assert_lost_then_replanned(c, victim)
        assert f"member {victim} was lost: {reason}" in c.log()
        # the lost member's control link is closed: it is out of the session, not left waiting
        await c.members[victim].inbox.until_closed()
        assert not any(isinstance(m, messages.Assign) and m.epoch == 2 for m in c.members[victim].inbox.got)


async def test_a_ring_edge_that_cannot_open_to_a_member_that_answers_evicts_nobody(
        tmp_path: Path, model: Path) -> None:
    """The same report while cy answers the coordinator's ping (issue 55, finding 1): one report evicts
    nobody. The epoch ends and all three are planned again, and admitted."""
    victim = "cy"
    behaviour = reports_its_predecessor(victim, dies=False)
    async with coordinator(tmp_path, model, NAMES, stall_s=REPORTER_STALL_S,
                           on_connect=dict.fromkeys(NAMES, behaviour)) as c:
        epoch = await c.reach("admitted")
        assert epoch == 2 and sorted(c.runtime.machine.order) == NAMES, c.log()
        assert f"but {victim} answers the coordinator: nobody is evicted" in c.log()
        assert "was lost" not in c.log() and victim not in c.runtime.machine.departed
        assert not any(c.members[n].inbox.of(messages.Lost) for n in NAMES)


async def test_a_member_silent_while_opening_its_edges_is_lost_at_the_stall_limit(
        tmp_path: Path, model: Path) -> None:
    """Told to connect, cy says nothing more (no `ready`, no `working`) while its link stays up: the
    coordinator does not wait for it forever: after STALL_S without progress it names cy and what it was
    doing, and plans again over the others."""
    victim = "cy"

    async def silent(m: ScriptedMember, msg: messages.Connect) -> None:
        return None

    async with coordinator(tmp_path, model, NAMES, stall_s=STALL_S, on_connect={victim: silent}) as c:
        epoch = await c.reach("admitted")
        reason = f"made no progress for {STALL_S:g} s while opening its ring edges"
        assert epoch == 2, c.log()
        assert f"{victim} {reason}" in c.log()
        assert_lost_then_replanned(c, victim, reason)
        await c.members[victim].inbox.until_closed()


async def test_a_member_that_keeps_working_while_opening_its_edges_is_waited_for(
        tmp_path: Path, model: Path) -> None:
    """cy opens its edges for twice the stall limit, saying `working` ten times a stall limit, then is ready:
    each message is progress, so the ring of all three is admitted in its first epoch. What this proves is
    the total (longer than the limit, yet no loss); the heartbeat's period, a tenth of the limit, is the
    margin a loaded machine gets."""
    victim = "cy"

    async def slow(m: ScriptedMember, msg: messages.Connect) -> None:
        for _ in range(20):
            await m.send(messages.Working(msg.epoch, "opening its ring edges"))
            await asyncio.sleep(STALL_S / 10)
        await m.send(messages.Ready(msg.epoch, None))

    async with coordinator(tmp_path, model, NAMES, stall_s=STALL_S, on_connect={victim: slow}) as c:
        epoch = await c.reach("admitted")
        assert epoch == 1 and sorted(c.runtime.machine.order) == NAMES, c.log()
        assert "made no progress" not in c.log()
        assert not any(c.members[n].inbox.of(messages.Lost) for n in NAMES)


async def test_stale_loss_reports_change_nothing_and_the_current_one_is_handled(
        tmp_path: Path, model: Path) -> None:
    """Once cy is lost (epoch 1) and ada and bo serve (epoch 2), bo goes silent as a killed process does and
    ada sends three reports in a row on its link: bo lost in epoch 1 (an epoch given up), cy lost in epoch 2
    (a member already handled, in no ring now), and bo lost in epoch 2. Only the third is a loss, once the
    coordinator's own link confirms it: bo is lost, cy's loss is not handled twice, and ada serves alone."""
    victim = "cy"
    behaviour = reports_its_predecessor(victim)
    async with coordinator(tmp_path, model, NAMES, on_connect=dict.fromkeys(NAMES, behaviour)) as c:
        assert await c.reach("admitted") == 2, c.log()
        ada = c.members["ada"]
        silence(c.members["bo"].ep)
        await ada.send(messages.Lost("bo", "a report of epoch 1", 1))
        await ada.send(messages.Lost("cy", "a late report of cy", 2))
        await ada.send(messages.Lost("bo", "its ring edge could not open: the current report", 2))
        epoch = await c.reach("admitted", after_epoch=2)
        log = c.log()
        assert epoch == 3 and c.runtime.machine.order == ["ada"], log
        assert c.state.members["bo"].status == "lost"
        assert log.count("member cy was lost") == 1 and "a late report of cy" not in log
        assert "a report of epoch 1" not in log
        assert [(m.who, m.epoch) for m in ada.inbox.got if isinstance(m, messages.Lost)] == [("cy", 1), ("bo", 2)]

"""The coordinator's machine in memory (coordinator/machine.py): losses, late joiners, drift, a takeover's
adoption and the stall limit, each from (sender, message, now) to the effects it returns, on a fake clock and
the real planner over SmolLM2's 30 blocks. The process-level tests of the same behaviours stay (test_host_losses,
test_late_join, test_drift_replan, member/test_takeover); these reach each path at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kafila.model.describe import describe_model
from kafila.model.embedded import default_model_path
from kafila.net.nat import NatClass
from kafila.net.trust import VerifiedMember
from kafila.session.coordinator import effects as fx
from kafila.session.coordinator.builds import RingBuilds
from kafila.session.coordinator.drift import HOLD_S
from kafila.session.coordinator.loss_reports import Probe
from kafila.session.coordinator.machine import Coordinator
from kafila.session.coordinator.planning import Planner
from kafila.session.protocol import messages
from kafila.session.protocol.records import StageTime
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState

pytestmark = pytest.mark.fast

INFO = describe_model(default_model_path())
SETTINGS = SessionSettings(context=512, concurrency=1, batch=32, speculate="off", stall_s=60.0)


def peer(name: str, bw: float = 1e10) -> VerifiedMember:
    m = {"bw": bw, "ubw": bw, "disp": 1e-4, "mem": 8 << 30}
    return VerifiedMember(name.encode(), name, name.encode().ljust(32, b"\0"), NatClass.PERMISSIVE, None, None, None,
                          1.0, m)


def machine(names: list[str], settings: SessionSettings = SETTINGS) -> Coordinator:
    m = Coordinator(settings, SessionState(role="host", phase="waiting"), Planner(INFO, settings), RingBuilds("b"))
    for n in names:
        assert m.join(peer(n), 0.0) == []
    return m


def sent(effects: list[fx.Effect], kind: type[messages.Control]) -> dict[str, messages.Control]:
    return {e.to: e.msg for e in effects if isinstance(e, fx.Send) and isinstance(e.msg, kind)}


def admitted(m: Coordinator, now: float = 0.0) -> list[fx.Effect]:
    """Plan, deliver and admit a ring: every member loads its stage and opens its edges at once."""
    effects = m.start(now)
    [cut] = [e for e in effects if isinstance(e, fx.Cut)]
    out = m.delivered(cut.epoch, now)
    for n in cut.placement.order:
        out += m.handle(n, messages.Loaded(cut.epoch), now)
    assert set(sent(out, messages.Connect)) == set(cut.placement.order)
    for n in cut.placement.order:
        out += m.handle(n, messages.Ready(cut.epoch, None), now)
    assert set(sent(out, messages.Admit)) == set(cut.placement.order) and m.state.phase == "admitted"
    assert any(isinstance(e, fx.Serve) for e in out) and any(isinstance(e, fx.Announce) for e in out)
    return out


def test_a_member_confirmed_lost_ends_the_epoch_and_the_others_are_planned_again() -> None:
    m = machine(["ada", "bo", "cy"])
    admitted(m)
    ring = m.order
    who, neighbour = ring[1], ring[0]
    assert m.handle(neighbour, messages.Lost(who, "edge down", 1), 5.0) == [Probe(who)]
    effects = m.probed(who, False, "it did not answer the coordinator's ping within 5 s", 10.0)
    stop = next(e for e in effects if isinstance(e, fx.Stop))
    assert stop.lost == who and f"member {who} was lost" in stop.reason  # requests in flight end, naming it
    assert fx.Close(who) in effects and set(sent(effects, messages.Lost)) == set(ring) - {who}
    [cut] = [e for e in effects if isinstance(e, fx.Cut)]
    assert cut.epoch == 2 and sorted(cut.placement.order) == sorted(set(ring) - {who})
    assert who in m.departed and m.state.phase == "delivering"


def test_a_report_about_a_member_that_answers_evicts_nobody_and_plans_everyone_again() -> None:
    m = machine(["ada", "bo", "cy"])
    admitted(m)
    who = m.order[1]
    m.handle(m.order[0], messages.Lost(who, "edge down", 1), 5.0)
    effects = m.probed(who, True, "", 5.1)
    assert not any(isinstance(e, fx.Close) for e in effects) and set(sent(effects, messages.Replan)) == set(m.peers)
    [cut] = [e for e in effects if isinstance(e, fx.Cut)]
    assert sorted(cut.placement.order) == ["ada", "bo", "cy"]


def test_a_report_from_a_member_that_is_no_neighbour_is_refused_before_any_handler() -> None:
    m = machine(["ada", "bo", "cy", "dan"])
    admitted(m)
    a, far = m.order[0], m.order[2]
    assert m.handle(a, messages.Lost(far, "made up", 1), 5.0) == [] and m.state.phase == "admitted"
    assert m.handle(m.order[1], messages.Stats({}, None, None), 5.0) == []  # only the head says how it runs


def test_a_late_joiner_is_held_and_planned_in_only_when_it_cuts_the_slowest_stage() -> None:
    m = machine(["ada", "bo"])
    admitted(m)
    assert m.join(peer("slow", bw=1e8), 20.0) == [] and "slow" in m.held
    assert "slow waits" in m.state.events[-1][1]
    effects = m.join(peer("fast", bw=1e11), 30.0)
    [stop] = [e for e in effects if isinstance(e, fx.Stop)]
    assert "fast joined" in stop.reason and "fast" not in m.held
    [cut] = [e for e in effects if isinstance(e, fx.Cut)]
    assert "fast" in cut.placement.order and "slow" not in cut.placement.order


def test_a_member_that_runs_slower_for_hold_s_is_planned_around_at_its_measured_speed() -> None:
    m = machine(["ada", "bo", "cy"])
    admitted(m)
    head, slow = m.order[0], m.order[1]
    predicted = {n: s.predicted_s for n, s in m.state.stages.items()}
    effects: list[fx.Effect] = []
    for t in range(1, int(HOLD_S) + 3):
        jitter = 1 + 1e-6 * (t % 2)
        stages = {n: StageTime(p, p * (4.0 if n == slow else 1.0) * jitter) for n, p in predicted.items()}
        effects = m.handle(head, messages.Stats(stages, None, None), float(t))
        if effects:
            break
    [stop] = [e for e in effects if isinstance(e, fx.Stop)]
    assert f"{slow} runs 4.0× slower than planned" in stop.reason
    assert m.speed[slow] == pytest.approx(4.0, rel=1e-3) and any(isinstance(e, fx.Cut) for e in effects)
    assert m.state.replans[-1]["member"] == slow


def test_a_member_taking_over_adopts_the_serving_ring_with_its_settings_unchanged() -> None:
    settings = replace(SETTINGS, speculate="lookup", copy=False, stall_s=33.0)
    old = machine(["ada", "bo", "cy"], settings)
    out = admitted(old)
    assign = messages.Assign(epoch=old.epoch, order=tuple(old.order), head=old.order[0], ranges={},
                             settings=old.settings, plan=old.state.plan or {}, model="m",
                             stage=messages.StageManifest("0" * 64, 1, 1, ("0" * 64,)))
    assert out and assign.settings == settings
    heir = machine(list(old.order), assign.settings)  # the member that takes over: the assignment's settings
    effects = heir.adopt(assign, 100.0)
    assert effects == [fx.Announce(tuple(old.order))] and heir.state.phase == "admitted"
    assert heir.epoch == old.epoch and heir.settings == settings
    # one ring member never reached it: lost, and the others planned again
    partial = machine(list(old.order)[:2], assign.settings)
    effects = partial.adopt(assign, 100.0)
    assert old.order[2] in partial.departed and any(isinstance(e, fx.Cut) for e in effects)
    assert set(sent(effects, messages.Lost)) == set(old.order[:2])


def test_a_member_silent_past_the_stall_limit_is_lost() -> None:
    m = machine(["ada", "bo"])
    [cut] = [e for e in m.start(0.0) if isinstance(e, fx.Cut)]
    assert m.next_timer() is None  # cutting: nobody is waited for yet
    m.delivered(cut.epoch, 10.0)
    m.handle("ada", messages.Working(cut.epoch, "loading its stage"), 50.0)
    assert m.next_timer() == 10.0 + SETTINGS.stall_s and m.timer(69.0) == []
    effects = m.timer(70.0)
    assert fx.Close("bo") in effects
    assert "bo made no progress for 60 s while receiving its stage" in [t for _, t in m.state.events]


def test_a_stage_fetched_from_a_url_shows_its_bytes_on_the_coordinator() -> None:
    """The coordinator sees none of those bytes move: the member's `working` says how many it holds."""
    m = machine(["ada"])
    [cut] = [e for e in m.start(0.0) if isinstance(e, fx.Cut)]
    m.state.delivery["ada"] = (0, 5_000)  # as the runtime sets it when it assigns the stage
    m.delivered(cut.epoch, 1.0)
    m.handle("ada", messages.Working(cut.epoch, "fetching its stage from a public URL", 2_000), 2.0)
    assert m.state.delivery["ada"] == (2_000, 5_000)
    m.handle("ada", messages.Working(cut.epoch, "fetching its stage from a public URL", 9_000), 3.0)
    assert m.state.delivery["ada"] == (5_000, 5_000)  # never past the stage
    m.handle("ada", messages.Working(cut.epoch - 1, "an old epoch's", 1), 4.0)
    assert m.state.delivery["ada"] == (5_000, 5_000)

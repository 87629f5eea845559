"""Fifty members for 10,000 simulated seconds on the real coordinator machine (issue 55, item 8): joins, polite
leaves, crashes, drifts, members whose speed swings, a misbehaving member and two coordinator crashes
(fleet_sim.py), and the invariants the control plane keeps. Each rule broken on purpose (a loss report taken
from anyone at its word; no re-plan budget) breaks an invariant: the check is shown to fail, not only to pass."""

from __future__ import annotations

import pytest

from kafila.session.coordinator.drift import Drift
from kafila.session.coordinator.loss_reports import Action, Evict, LossReports
from kafila.session.coordinator.machine import Coordinator
from kafila.session.coordinator.replan_budget import ReplanBudget, Verdict
from kafila.session.protocol import messages
from kafila.session.protocol.authority import RingView, Sender, refusal
from tests.session.coordinator.fleet_sim import SETTINGS, Fleet, Record, evicted_live, replans_per_hour

pytestmark = pytest.mark.fast

UNTIL_S = 10_000.0
MAX_DRIFT_REPLANS_PER_HOUR = 6  # with the budget: back-off from 30 s doubling, each swinging member at its slowest
MAX_REPLANS_PER_HOUR = 40  # every new plan, whatever called for it (crashes, leaves and arrivals included)


def broken_invariants(record: Record) -> list[str]:
    """Each invariant the run broke, said as a person would (empty: it kept them all)."""
    broken = []
    if max(record.live_at_once) != 1 or min(record.live_at_once) != 1:
        broken.append(f"coordinators alive at once ranged {min(record.live_at_once)}..{max(record.live_at_once)}")
    if any(len(heirs) != 1 for heirs in record.heirs):
        broken.append(f"the survivors of a coordinator chose different successors: {record.heirs}")
    if any(settings != SETTINGS for _, _, settings in record.coordinators):
        broken.append("a coordinator ran with other settings than the session's")
    twice = [rid for rid, r in record.requests.items() if len(r.ended) != 1]
    if twice:
        broken.append(f"{len(twice)} requests did not end exactly once")
    mute = [r.ended[0] for r in record.requests.values() if r.ended and r.ended[0] != "finished"
            and not any(cause in r.ended[0] for cause in ("was lost", "planned again", "closed", "ended"))]
    if mute:
        broken.append(f"requests failed without naming a cause: {mute[:3]}")
    if evicted_live(record):
        broken.append(f"members evicted while alive and answering: {evicted_live(record)[:3]}")
    drift = max(replans_per_hour(record.drift_replans, UNTIL_S))
    if drift > MAX_DRIFT_REPLANS_PER_HOUR:
        broken.append(f"{drift} drift re-plans in a simulated hour (at most {MAX_DRIFT_REPLANS_PER_HOUR})")
    every = max(replans_per_hour(record.epochs, UNTIL_S))
    if every > MAX_REPLANS_PER_HOUR:
        broken.append(f"{every} plans in a simulated hour (at most {MAX_REPLANS_PER_HOUR})")
    if record.forged_delivered:
        broken.append(f"{record.forged_delivered} head-only messages from another member were acted on")
    return broken


@pytest.mark.parametrize("seed", [1, 2])
def test_fifty_members_for_ten_thousand_seconds_keep_every_invariant(seed: int) -> None:
    record = Fleet(seed, UNTIL_S).run()
    assert broken_invariants(record) == []
    # it was a session worth checking: coordinators crashed and were succeeded, rings served and broke
    assert len(record.coordinators) == 3 and len(record.requests) > 1000 and len(record.epochs) > 20
    assert sum(r.ended == ["finished"] for r in record.requests.values()) > 1000
    assert record.drift_replans and any(who == "m49" for _, who, _ in record.evicted)  # the liar, and only it


class TakenAtItsWord(LossReports):
    """A loss report evicts whoever it names, unconfirmed (before issue 55)."""

    def report(self, reporter: str, who: str, reason: str) -> list[Action]:
        return [Evict(who, reason)]


class NoBudget(ReplanBudget):
    """Every drift worth a plan re-plans at once, at the speed seen now (before issue 55)."""

    def weigh(self, now: float, drift: Drift, planned: dict[str, float], measured: dict[str, float]) -> Verdict:
        return Verdict(measured)


def report_from_anyone(machine: Coordinator) -> None:
    def authority(sender: Sender, msg: messages.Control, view: RingView) -> str | None:
        return None if isinstance(msg, messages.Lost) else refusal(sender, msg, view)
    machine.authority, machine.reports = authority, TakenAtItsWord()


def no_budget(machine: Coordinator) -> None:
    machine.budget = NoBudget()


@pytest.mark.parametrize(("tamper", "found"), [
    (report_from_anyone, "members evicted while alive and answering"),
    (no_budget, "drift re-plans in a simulated hour"),
])
def test_a_broken_rule_breaks_an_invariant(tamper: object, found: str) -> None:
    record = Fleet(1, UNTIL_S, tamper).run()  # type: ignore[arg-type]
    broken = broken_invariants(record)
    assert any(found in b for b in broken), broken

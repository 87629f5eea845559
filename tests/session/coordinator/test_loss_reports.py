"""The loss reports' machine (coordinator.loss_reports) in memory: a self-report evicts at once; another
member's report is probed on the coordinator's own link, evicting only when the link confirms it."""

from __future__ import annotations

import pytest

from kafila.session.coordinator.loss_reports import REFUTED_S, Evict, LossReports, Probe, Replan

pytestmark = pytest.mark.fast


def test_a_member_that_reports_itself_lost_is_evicted_at_once() -> None:
    assert LossReports().report("bo", "bo", "its stage failed") == [Evict("bo", "its stage failed")]


def test_a_neighbours_report_is_probed_and_evicts_nobody_when_the_member_answers() -> None:
    r = LossReports()
    assert r.report("ada", "bo", "edge down") == [Probe("bo")]
    assert r.report("cy", "bo", "edge down too") == []  # one probe for both neighbours' reports
    [replan] = r.answered("bo")
    assert isinstance(replan, Replan) and "nobody is evicted" in replan.reason and "ada" in replan.reason
    assert r.answered("bo") == [] and r.unanswered("bo", "late") == []  # nothing pending any more


def test_a_neighbours_report_confirmed_by_the_coordinators_link_evicts() -> None:
    r = LossReports()
    r.report("ada", "bo", "edge down")
    assert r.unanswered("bo", "no answer within 5 s") == [
        Evict("bo", "edge down", "ada's report confirmed: no answer within 5 s")]


def test_a_new_epoch_voids_the_reports_pending() -> None:
    r = LossReports()
    r.report("ada", "bo", "edge down")
    r.reset()
    assert r.answered("bo") == [] and r.unanswered("bo", "down") == []
    assert r.report("ada", "bo", "again") == [Probe("bo")]


def test_a_reporter_refuted_twice_within_the_window_is_the_one_evicted() -> None:
    # issue 55: without this a member could re-plan the ring at will by lying about a neighbour that answers
    r = LossReports()
    r.report("mallory", "bo", "made up")
    assert isinstance(r.answered("bo", now=100.0)[0], Replan)
    r.report("mallory", "bo", "made up again")
    [evict] = r.answered("bo", now=100.0 + REFUTED_S - 1)
    assert evict.who == "mallory" and "refuted 2 times" in evict.reason
    r.report("mallory", "bo", "after the window")  # its count starts over once it is evicted
    assert isinstance(r.answered("bo", now=10 * REFUTED_S)[0], Replan)
    r.report("ada", "bo", "once")
    assert isinstance(r.answered("bo", now=20 * REFUTED_S)[0], Replan)
    r.report("ada", "bo", "an hour later")
    assert isinstance(r.answered("bo", now=21 * REFUTED_S)[0], Replan)  # outside the window: not evicted

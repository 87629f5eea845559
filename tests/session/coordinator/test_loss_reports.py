"""The loss reports' machine (coordinator.loss_reports) in memory: a self-report evicts at once; another
member's report is probed on the coordinator's own link, evicting only when the link confirms it."""

from __future__ import annotations

import pytest

from kafila.session.coordinator.loss_reports import Evict, LossReports, Probe, Replan

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

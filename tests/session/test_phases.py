"""Phases change only as one table says (issue 55, item 3): the legal paths pass, an illegal change raises in tests
and is logged (the phase still changes) in production."""

from __future__ import annotations

import logging

import pytest

from kafila.session.phases import ANYWHERE, PHASES, TRANSITIONS, IllegalTransition, illegal
from kafila.session.state import SessionState

pytestmark = pytest.mark.fast

PATHS = {  # each as the session code walks it (the diagram in kafila/session/phases.py)
    "member joins and serves": ["starting", "measuring", "waiting", "measuring", "waiting", "delivering",
                                "connecting", "admitted"],
    "member re-planned, then loses a neighbour": ["waiting", "delivering", "connecting", "admitted", "delivering",
                                                  "connecting", "admitted", "lost", "delivering", "connecting",
                                                  "admitted", "closed"],
    "member's edge fails before admission": ["waiting", "delivering", "connecting", "delivering", "lost"],
    "member refused while measuring": ["starting", "waiting", "measuring", "rejected", "lost"],
    "coordinator plans, re-plans on a drift": ["starting", "waiting", "planning", "delivering", "connecting",
                                               "admitted", "planning", "delivering", "connecting", "admitted",
                                               "lost", "planning", "rejected"],
    "successor adopts a serving ring": ["starting", "waiting", "admitted", "lost", "planning", "delivering"],
    "the TUI ends a flow": ["starting", "waiting", "closed", "lost"],
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_legal_path_walks(path: str) -> None:
    steps = PATHS[path]
    state = SessionState(phase=steps[0])
    for phase in steps[1:]:
        state.set_phase(phase, f"to {phase}")
        assert state.phase == phase
    assert [text for _, text in state.events] == [f"to {p}" for p in steps[1:]]


@pytest.mark.parametrize(("current", "new"), [
    ("starting", "admitted"), ("planning", "admitted"), ("waiting", "connecting"), ("measuring", "delivering"),
    ("admitted", "connecting"), ("rejected", "admitted"), ("closed", "waiting"), ("closed", "rejected"),
    ("lost", "admitted"),
])
def test_an_illegal_change_raises_in_tests(current: str, new: str) -> None:
    state = SessionState(phase=current)
    with pytest.raises(IllegalTransition, match=f"cannot change from '{current}' to '{new}'"):
        state.set_phase(new)
    assert state.phase == current  # unchanged


def test_in_production_an_illegal_change_is_logged_and_made(caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFILA_STRICT_PHASES")
    state = SessionState(phase="planning")
    with caplog.at_level(logging.WARNING, "kafila.session"):
        state.set_phase("admitted", "admitted: 3 members")
    assert state.phase == "admitted"
    assert "the phase cannot change from 'planning' to 'admitted'" in caplog.text
    with pytest.raises(IllegalTransition, match="'serving' is not a phase"):  # a name that is no phase: always
        state.set_phase("serving")


def test_the_table_names_every_phase_and_only_phases() -> None:
    assert set(TRANSITIONS) == set(PHASES)
    assert all(to <= set(PHASES) for to in TRANSITIONS.values()) and ANYWHERE <= set(PHASES)
    # every phase is reachable from "starting"
    reach, todo = {"starting"}, ["starting"]
    while todo:
        for nxt in PHASES:
            if nxt not in reach and illegal(todo[-1], nxt) is None:
                reach.add(nxt)
                todo.insert(0, nxt)
        todo.pop()
    assert reach == set(PHASES)

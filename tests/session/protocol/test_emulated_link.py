"""EMULATION `--link-rate`: a member's emulated connection travels in its announcement and shows, labelled as
emulated, in the plan's summary and the TUI's Members pane, beside its emulated link delay."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kafila.session.protocol.announcement import Emulation
from kafila.session.state import MemberView, SessionState
from kafila.session.terminal.report import plan_summary
from kafila.tui.widgets.members import emulation_text

pytestmark = pytest.mark.fast


def test_an_emulated_connection_is_announced_to_three_digits() -> None:
    assert Emulation(link_delay_ms=40, link_up_mbit=40, link_down_mbit=160).as_dict() == \
        {"link_delay_ms": 40, "link_mbit": [40, 160]}
    assert Emulation(link_up_mbit=12345.675, link_down_mbit=0.125).as_dict() == {"link_mbit": [12300, 0.125]}
    assert Emulation().as_dict() == {}  # nothing emulated: nothing said


def test_an_emulated_connection_shows_as_emulated() -> None:
    emu = Emulation(link_delay_ms=20, link_up_mbit=40, link_down_mbit=160).as_dict()
    view = MemberView("ada", status="serving", emulated=emu)
    assert emulation_text(view).plain == "EMULATED +20 ms link 40/160 Mbit/s"
    same = MemberView("bo", emulated=Emulation(link_up_mbit=40, link_down_mbit=40).as_dict())
    assert emulation_text(same).plain == "EMULATED link 40 Mbit/s"
    state = SessionState(role="host", plan={"order": ["ada"], "head": "ada", "ranges": {"ada": [0, 30]},
                                            "stage_seconds": {"ada": 0.01}, "bottleneck_seconds": 0.01,
                                            "memory_bytes": {"ada": 1e8}})
    state.upsert_member(view)
    out = io.StringIO()
    Console(file=out, width=200).print(plan_summary(state))
    assert "link_delay_ms 20, link_mbit 40/160" in out.getvalue(), out.getvalue()

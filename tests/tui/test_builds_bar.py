"""The session bar says when a ring mixes llama.cpp builds; `kafila tui --host --mixed-builds` asks for it.

The app renders a change on its next tick, not at once: each check after a change waits for that render
(the event), bounded only against a hang, instead of pausing a fixed time a loaded machine may outlast.
"""

from __future__ import annotations

import argparse

import pytest
from textual.pilot import Pilot

from kafila.tui.app import KafilaApp
from kafila.tui.flows import flow_for
from tests.tui import states
from tests.tui.screen_text import screen_text
from tests.tui.test_app import until

pytestmark = pytest.mark.fast

HANG_S = 60  # a bound on a hang only


async def rendered(app: KafilaApp, pilot: Pilot[int]) -> str:
    """The screen once the app has rendered the state's last change (on its next tick) and drawn it."""
    await until(lambda: not app._dirty, timeout=HANG_S)  # the change has been rendered
    await pilot.pause()  # and the widgets it updated have been drawn
    return screen_text(app)


async def test_the_bar_says_mixed_and_who_differs() -> None:
    state = states.admitted_state()
    state.builds = {"mode": "mixed", "host": "0.3.36/aaaa/bbbb", "bit_exact": False,
                    "differ": {"rtx3060-laptop": ["llama.cpp libraries: x there, y here"]}}
    app = KafilaApp(state)
    async with app.run_test(size=(240, 30)) as pilot:
        await pilot.pause()
        assert "MIXED builds, not bit-exact (rtx3060-laptop differ)" in screen_text(app)
        state.builds = {**state.builds, "mode": "exact", "bit_exact": True, "differ": {}}
        state.changed()
        assert "MIXED" not in await rendered(app, pilot)


def test_tui_host_and_demo_pass_mixed_builds_on() -> None:
    args = argparse.Namespace(rendezvous=None, concurrency=None, context=None, api_port=None, demo=False, host="",
                              members=None, mixed_builds=True, join=None, name=None)
    flow, label = flow_for(args)
    assert label == "host" and flow.args[0].settings.mixed_builds is True  # type: ignore[attr-defined]
    flow, label = flow_for(argparse.Namespace(**{**vars(args), "demo": True}))
    assert label == "demo" and flow.args[0].mixed_builds is True  # type: ignore[attr-defined]
    flow, _ = flow_for(argparse.Namespace(**{**vars(args), "mixed_builds": None}))
    assert flow.args[0].settings.mixed_builds is False  # type: ignore[attr-defined]


async def test_the_bar_says_who_coordinates_once_the_host_left() -> None:
    state = states.admitted_state()
    state.role, state.me, state.coordinator = "member", "bo", "host"
    app = KafilaApp(state)
    async with app.run_test(size=(240, 30)) as pilot:
        await pilot.pause()
        assert "coordinator host" in screen_text(app)
        head = (state.plan or {})["head"]
        state.coordinator, state.coordinator_left = head, "the coordinator (host) left the session: Idle timeout"
        state.changed()
        assert f"host left: {head} coordinates" in await rendered(app, pilot)


def test_tui_host_serves_unless_coordinate_only() -> None:
    args = argparse.Namespace(rendezvous=None, concurrency=None, context=None, api_port=None, demo=False, host="",
                              members=2, mixed_builds=None, join=None, name=None, coordinate_only=None)
    flow, _ = flow_for(args)
    assert flow.args[0].coordinate_only is False and flow.args[0].members == 2  # type: ignore[attr-defined]
    flow, _ = flow_for(argparse.Namespace(**{**vars(args), "coordinate_only": True}))
    assert flow.args[0].coordinate_only is True  # type: ignore[attr-defined]


async def test_the_bar_says_when_the_rendezvous_is_unreachable_and_when_it_is_back() -> None:
    state = states.admitted_state()
    app = KafilaApp(state)
    async with app.run_test(size=(240, 30)) as pilot:
        await pilot.pause()
        assert "rendezvous unreachable" not in screen_text(app)
        state.set_rendezvous("the rendezvous 127.0.0.1:3478 is unreachable (silent for 8 s): direct edges serve on")
        assert "rendezvous unreachable: direct edges only" in await rendered(app, pilot)
        state.set_rendezvous(None)
        assert "rendezvous unreachable" not in await rendered(app, pilot)
    assert [text for _, text in state.events[-2:]] == [
        "the rendezvous 127.0.0.1:3478 is unreachable (silent for 8 s): direct edges serve on",
        "the rendezvous answers again: re-registering with it"]

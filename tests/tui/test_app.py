"""Pilot tests of the dashboard: each screen from constructed/recorded states, the chat against the real API
server with a scripted ring (tests/tui/scripted_api.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, TabbedContent

from kafila.errors import SessionError
from kafila.session.api.client import RAW_TEXT_NOTICE
from kafila.session.state import MemberView, SessionState
from kafila.tui.app import KafilaApp
from kafila.tui.screens.lost import LostScreen
from kafila.tui.widgets.chat import ChatPane, MessageView
from tests.tui import states
from tests.tui.screen_text import screen_text
from tests.tui.scripted_api import Script

pytestmark = pytest.mark.fast

SMALL = (80, 24)


async def until(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Wait for the app to reach a condition (workers and timers run meanwhile)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


async def started(app: KafilaApp, pilot: Pilot[int]) -> None:
    """Wait for the first render: it picks the tab (chat when admitted), so keys pressed before it are lost."""
    await until(lambda: app.rendered)
    await pilot.pause()


@contextlib.asynccontextmanager
async def chat_app(api: str) -> AsyncIterator[tuple[KafilaApp, Pilot[int], ChatPane]]:
    """The dashboard of an admitted session whose chat API serves at `api`, rendered: the app, its pilot, its chat."""
    state = states.admitted_state()
    state.api_url = api
    app = KafilaApp(state)
    async with app.run_test(size=SMALL) as pilot:
        await started(app, pilot)
        yield app, pilot, app.dashboard.query_one(ChatPane)


def active_tab(app: KafilaApp) -> str:
    return str(app.dashboard.query_one(TabbedContent).active)


async def test_members_appear_as_they_join() -> None:
    full = states.members_state()
    st = SessionState(role="host", phase="waiting", code="kf-1")
    app = KafilaApp(st, tick_s=0.05)
    async with app.run_test(size=SMALL) as pilot:
        table = app.dashboard.query_one(DataTable)
        await started(app, pilot)
        assert table.row_count == 0 and "Waiting for members" in screen_text(app)
        for i, view in enumerate(full.members.values()):
            st.upsert_member(view)  # the session code's update; the app re-renders on its next tick
            await until(lambda i=i: table.row_count == i + 1)
        st.update_member("rtx3060-laptop", status="measuring", probe_samples=[1e9, 2e9, 3e9])
        await until(lambda: "measuring" in str(table.get_cell("rtx3060-laptop", "status")))
        text = screen_text(app)
        assert "old-i7-desktop EMU" in text and "22.0*" in text  # emulation marked where it is shown
        assert "mbp-m3pro-18gb" in text and "NAT ordinary from: mapped=" in text  # detail of the first member
        assert "5 members" in text
        await pilot.press("down", "down")  # the cursor moves: the detail follows
        await until(lambda: "EMULATED ÷4 bw ≤24 GB" in screen_text(app))


async def test_matrix_shows_predicted_and_verified_edges_and_the_wrong_one() -> None:
    app = KafilaApp(states.admitted_state())
    async with app.run_test(size=SMALL) as pilot:
        await started(app, pilot)
        await pilot.press("f2")
        await pilot.pause()
        assert active_tab(app) == "reach"
        text = screen_text(app)
        assert "predicted reachability" in text and "1  2  3  4  5" in text
        assert "[D]" in text  # ring edges verified direct
        assert "!D!" in text  # a direct guess that verification found relayed
        assert "[R]" in text  # the restrictive laptop's relay, predicted and found
        state = app.state
        wrong = next(e for e in state.edges if e.wrong)
        order = [*state.plan["order"]]  # type: ignore[index]
        pair = f"{order.index(wrong.a) + 1}→{order.index(wrong.b) + 1}"
        row = next(line for line in text.splitlines() if line.lstrip().startswith(pair))
        assert "direct" in row and "relayed" in row and "✗ WRONG" in row
        assert sum("✓" in line for line in text.splitlines()) == len(state.edges) - 1
        assert "does not exist (some edges must be relayed)" in text  # 1 permissive, 3 ordinary, 1 restrictive


async def test_plan_shows_ranges_to_scale_bottleneck_and_baselines() -> None:
    state = states.admitted_state()
    app = KafilaApp(state)
    async with app.run_test(size=(100, 40)) as pilot:
        await started(app, pilot)
        await pilot.press("f3")
        await pilot.pause()
        text = screen_text(app)
        assert f"head {state.plan['head']}" in text and "(head)" in text  # type: ignore[index]
        for name, (a, b) in state.plan["ranges"].items():  # type: ignore[index]
            row = next(line for line in text.splitlines() if f"[{a},{b})" in line and name[:10] in line)
            assert "█" in row
        plan = state.plan
        assert plan is not None
        slow = max(plan["stage_seconds"], key=plan["stage_seconds"].__getitem__)
        bottleneck_row = next(line for line in text.splitlines() if "◀" in line)
        assert slow[:10] in bottleneck_row and f"{plan['bottleneck_seconds'] * 1000:.2f}" in bottleneck_row
        assert f"utilisation {plan['utilisation']:.0%}" in text
        lines = text.splitlines()
        top = lines.index(next(line for line in lines if "strategies side by side" in line))
        compare = {line.split()[0]: line for line in lines[top + 2:top + 5]}
        assert "1.00×" in compare["kafila"]
        for name in ("uniform", "memory"):
            ratio = plan["baselines"][name]["bottleneck_seconds"] / plan["bottleneck_seconds"]
            assert f"{ratio:.2f}×" in compare[name]


async def test_rejection_shows_reasons_and_what_would_admit() -> None:
    state = states.rejected_state()
    app = KafilaApp(state)
    async with app.run_test(size=SMALL) as pilot:
        await started(app, pilot)
        assert active_tab(app) == "admission"  # a rejection opens the reasons
        text = screen_text(app)
        assert "REJECTED" in text and "does not fit in memory" in text
        assert "What would admit the session" in text
        # every remedy the planner gave, each on its own line (the screen's job; the numbers are the planner's)
        remedies = next(line for line in str(state.rejection).splitlines() if line.startswith("would admit: "))
        shown = [" ".join(line.split()) for line in text.splitlines()]
        for remedy in remedies.removeprefix("would admit: ").split("; or "):
            assert any(line.startswith(f"→ {remedy}") for line in shown), (remedy, shown)
        assert "✗ rejected" in text
        prompt = app.dashboard.query_one("#prompt", Input)
        assert prompt.disabled


async def test_chat_streams_a_reply_and_saves_it(api: str, script: Script, data_dir: Path) -> None:
    script.delay_s = 0.05
    async with chat_app(api) as (app, pilot, chat):
        assert active_tab(app) == "chat"  # admission opens the chat
        prompt = app.dashboard.query_one("#prompt", Input)
        assert app.focused is prompt
        await pilot.press(*"what is 1+2?")  # digits go to the prompt, not to the tab keys
        conv = chat.conversations[0]
        await until(lambda: conv.draft_path.exists())
        assert conv.draft_path.read_text() == "what is 1+2?"  # saved as typed
        await pilot.press("enter")
        # the reply is over once its request reached the ring and the chat stopped streaming (waiting to
        # see it streaming first could miss a short reply on a busy machine)
        await until(lambda: len(script.requests) == 1 and not chat.streaming)
        replies = [m for m in app.dashboard.query(MessageView) if m.role == "assistant"]
        assert replies[-1].body == "Hello, ring!" and replies[-1].error is None
        text = screen_text(app)
        assert "Hello, ring!" in text and "42.5 tok/s" in text and "network 18%" in text
        assert "alpha" in text and "4.5/4.0" in text
        assert script.requests[0]["messages"] == [{"role": "user", "content": "what is 1+2?"}]
        lines = [json.loads(x) for x in conv.path.read_text().splitlines()]
        assert [r["type"] for r in lines] == ["meta", "user", "delta", "delta", "delta", "delta", "end"]
        assert conv.path.parent == data_dir / "chats"

        # A second conversation starts empty and sends no history; the first keeps its own.
        await pilot.press("ctrl+n")
        assert len(chat.conversations) == 2 and not list(app.dashboard.query(MessageView))
        await pilot.press(*"again", "enter")
        await until(lambda: len(script.requests) == 2 and not chat.streaming)
        assert script.requests[1]["messages"] == [{"role": "user", "content": "again"}]
        chat.switch_to(0)
        await pilot.pause()
        assert [m.body for m in app.dashboard.query(MessageView)] == ["what is 1+2?", "Hello, ring!"]


async def test_chat_error_is_shown_and_recorded(api: str, script: Script) -> None:
    script.refuse("the ring is reloading")
    async with chat_app(api) as (app, pilot, chat):
        await pilot.press(*"hi", "enter")
        path = chat.conversations[0].path
        await until(lambda: not chat.streaming and path.exists() and '"end"' in path.read_text())
        await pilot.pause()
        assert "the ring is reloading" in " ".join(screen_text(app).split())  # however the line wraps
        assert script.requests == []  # the server answered 503 itself: the session is not serving
        recs = [json.loads(x) for x in chat.conversations[0].path.read_text().splitlines()]
        assert recs[-1]["type"] == "end" and "the ring is reloading" in recs[-1]["error"]


async def test_chat_shows_a_notice_and_keeps_the_reply_whole(api: str, script: Script) -> None:
    """A notice mid-reply (a member lost, the reply resumed) is shown to the reader, not mixed into the text."""
    script.notices = {2: "member beta was lost"}
    async with chat_app(api) as (app, pilot, chat):
        await pilot.press(*"hi", "enter")
        await until(lambda: len(script.requests) == 1 and not chat.streaming)
        await pilot.pause()
        replies = [m for m in app.dashboard.query(MessageView) if m.role == "assistant"]
        assert replies[-1].body == "Hello, ring!" and replies[-1].error is None
        # shown as a notification (a toast over the screen, kept by the app for its timeout)
        assert [n.message for n in app._notifications] == ["member beta was lost"]


async def test_a_base_model_completes_raw_text_and_says_so_once(api: str, script: Script) -> None:
    """A model without a chat template: each line is completed as raw text; one notification says so."""
    script.chat_template, script.echo = False, True
    async with chat_app(api) as (app, pilot, chat):
        await pilot.press(*"Once upon", "enter")
        await until(lambda: len(script.requests) == 2 and not chat.streaming)
        await pilot.press(*"The end", "enter")
        await until(lambda: len(script.requests) == 3 and not chat.streaming)
        await pilot.pause()
        replies = [m.body for m in app.dashboard.query(MessageView) if m.role == "assistant"]
        assert replies == ["echo: Once upon", "echo: The end"]
        assert [r.get("prompt") for r in script.requests] == [None, "Once upon", "The end"]
        assert [(n.title, n.message) for n in app._notifications] == [("model", RAW_TEXT_NOTICE)]


async def test_session_lost_is_clear_and_keeps_the_dashboard() -> None:
    state = states.admitted_state()
    app = KafilaApp(state, tick_s=0.05)
    async with app.run_test(size=SMALL) as pilot:
        await started(app, pilot)
        state.lost = "rtx3060-laptop stopped answering"
        state.set_phase("lost", "lost rtx3060-laptop")  # as the session code reports it
        await until(lambda: isinstance(app.screen, LostScreen))
        await pilot.pause()
        text = screen_text(app)
        assert "SESSION LOST" in text and "rtx3060-laptop stopped answering" in text
        assert "conversations are saved in" in text
        await pilot.press("escape")
        await until(lambda: not isinstance(app.screen, LostScreen))
        assert app.dashboard.query_one("#prompt", Input).disabled
        assert " LOST " in screen_text(app)


async def test_flow_runs_as_a_worker_and_drives_the_screens(api: str) -> None:
    """A stand-in for the runner: it updates the state as run_host would, from the app's own loop."""
    full = states.admitted_state()
    full.api_url = api

    async def flow(state: SessionState) -> int:
        state.role, state.code, state.model = "host", full.code, full.model
        state.set_phase("waiting", "session open")
        for view in full.members.values():
            await asyncio.sleep(0.02)
            state.upsert_member(MemberView(view.name, nat=view.nat, probe_samples=view.probe_samples[:3]))
        state.set_phase("planning")
        state.plan, state.predicted, state.edges = full.plan, full.predicted, full.edges
        state.api_url, state.stages = full.api_url, full.stages
        state.set_phase("delivering")
        state.set_phase("connecting")
        state.set_phase("admitted", "admitted")
        await asyncio.Event().wait()  # a session runs until cancelled
        return 0

    app = KafilaApp(flow=flow, tick_s=0.05)
    async with app.run_test(size=SMALL) as pilot:
        await until(lambda: active_tab(app) == "chat")
        await pilot.press("f1")
        await pilot.pause()
        assert app.dashboard.query_one(DataTable).row_count == 5
        await pilot.press("f3")
        await pilot.pause()
        assert "◀" in screen_text(app)


@pytest.mark.parametrize("grouped", [False, True], ids=["raised", "in-a-task-group"])
async def test_flow_failure_becomes_the_lost_state(grouped: bool) -> None:
    """The session's end reads as its reason, also when a TaskGroup wrapped it (never "internal error")."""
    async def flow(state: SessionState) -> int:
        state.set_phase("waiting")
        error = SessionError("the rendezvous at 10.0.0.1:3478 does not answer")
        if grouped:
            raise ExceptionGroup("unhandled errors in a TaskGroup", [ExceptionGroup("inner", [error])])
        raise error

    app = KafilaApp(flow=flow, tick_s=0.05)
    async with app.run_test(size=SMALL) as pilot:
        await until(lambda: isinstance(app.screen, LostScreen))
        await pilot.pause()
        assert "the rendezvous at 10.0.0.1:3478 does not answer" in screen_text(app)
        assert "internal error" not in screen_text(app) and app.state.phase == "lost"


async def test_attach_follows_a_running_session(api: str, script: Script) -> None:
    attached = states.admitted_state()
    attached.api_url = None  # the poller fills in the URL it attached to
    script.show(attached)
    app = KafilaApp(SessionState(phase="connecting"), attach=api, tick_s=0.05)
    async with app.run_test(size=SMALL) as pilot:
        await until(lambda: app.state.phase == "admitted")
        await until(lambda: active_tab(app) == "chat")
        assert app.state.api_url == api
        await pilot.press("f1")
        await pilot.pause()
        assert app.dashboard.query_one(DataTable).row_count == 5


TABS = {"f1": "Members", "f2": "Reachability", "f3": "Plan", "f4": "Admission", "f5": "Chat"}


def hidden_at_80x24(state: SessionState, key: str, lines: list[str]) -> list[str]:
    """What a person could not read on this screen: each expected label or value not shown whole."""
    def shown(text: str, where: list[str]) -> bool:
        return any(re.search(rf"(?<![\w-]){re.escape(text)}(?![\w-])", line) for line in where)

    body = lines[3:-1]
    expect: list[tuple[str, list[str]]] = [("KAFILA", lines[:1]), (state.phase.upper(), lines[:1]),
                                           (str(state.code), lines[:1])]
    expect += [(label, lines[1:2]) for label in TABS.values()]
    expect += [(f"{k} {label}", lines[-1:]) for k, label in TABS.items()] + [("^q Quit", lines[-1:])]
    if key == "f1":
        for m in state.members.values():
            expect += [(m.name, body)] + [(m.nat, body)] * bool(m.nat)
    if key == "f3" and state.plan and state.plan.get("ranges"):
        for name, (a, e) in state.plan["ranges"].items():
            expect.append((f"{name}", body))
            expect.append((f"[{a},{e})", body))
    if key == "f4":
        expect.append((state.phase, [line.lower() for line in body]))
    return [f"{text!r} not whole in:\n" + "\n".join(where) for text, where in expect if not shown(text, where)]


@pytest.mark.slow
async def test_every_tab_shows_its_labels_and_values_whole_at_80x24() -> None:
    problems = []
    for name, make in states.ALL.items():
        state = make()
        app = KafilaApp(state)
        async with app.run_test(size=SMALL) as pilot:
            await started(app, pilot)
            for key in TABS:
                if isinstance(app.screen, LostScreen):
                    await pilot.press("escape")
                await pilot.press(key)
                await pilot.pause()
                lines = screen_text(app).splitlines()
                assert len(lines) == SMALL[1], lines
                problems += [f"{name} {key}: {p}" for p in hidden_at_80x24(state, key, lines)]
    assert not problems, "\n".join(problems)


async def test_state_recorded_from_a_real_demo_run() -> None:
    """`kafila tui --demo --record` on a real run, replayed: the screens render what the session reported."""
    recorded = json.loads((Path(__file__).parent / "data" / "demo-admitted.json").read_text())
    state = SessionState.from_json(recorded)
    app = KafilaApp(state)
    async with app.run_test(size=SMALL) as pilot:
        await started(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert app.dashboard.query_one(DataTable).row_count == 3
        text = screen_text(app)
        assert "bo EMU" in text and "cy EMU" in text and "ada EMU" not in text
        await pilot.press("f2")
        await pilot.pause()
        text = screen_text(app)
        assert sum("✓" in line for line in text.splitlines()) == 3 and "WRONG" not in text
        await pilot.press("f3")
        await pilot.pause()
        text = screen_text(app)
        assert f"head {state.plan['head']}" in text and "◀" in text  # type: ignore[index]


async def test_escape_stops_a_reply_and_keeps_what_arrived(api: str, script: Script) -> None:
    script.pieces, script.delay_s = [f"w{i} " for i in range(100)], 0.05
    async with chat_app(api) as (app, pilot, chat):
        await pilot.press(*"long one", "enter")
        conv = chat.conversations[0]
        await until(lambda: '"delta"' in conv.path.read_text())
        await pilot.press("escape")
        await until(lambda: not chat.streaming)
        reply = [m for m in app.dashboard.query(MessageView) if m.role == "assistant"][-1]
        assert reply.body.startswith("w0 ") and "w99" not in reply.body and reply.error == "stopped before the end"
        recs = [json.loads(x) for x in conv.path.read_text().splitlines()]
        assert recs[-1]["type"] == "end" and recs[-1]["error"] == "stopped before the end"
        assert conv.history() == [{"role": "user", "content": "long one"}]  # a cut-off reply is not resent

"""Pilot against a real loopback session: the dashboard runs the demo flow (rendezvous, three member
processes, the host in this loop) as its worker, and a chat streams a reply through the ring.

Every demo here runs in the test's own cache, seeded with the shared probe (conftest.demo_cache): it
neither probes afresh nor writes the user's cache, and each test checks so once its demo has stopped."""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from kafila.bench.proc_mem import children
from kafila.process import alive
from kafila.session.api.client import ApiClient
from kafila.session.launch.demo import DemoOptions, run_demo
from kafila.session.member.join import run_member
from kafila.session.options import MemberOptions
from kafila.tui.app import KafilaApp
from kafila.tui.screens.lost import LostScreen
from kafila.tui.widgets.chat import ChatPane, ChatSettings, MessageView
from tests.conftest import REPO, llama_cpp_reply
from tests.session.cluster import REPLY_TIMEOUT_S, Cluster
from tests.tui.demo_cache import assert_demo_ran_in, probe_files
from tests.tui.screen_text import screen_text
from tests.tui.test_app import until

pytestmark = pytest.mark.slow

DEMO_PROCESSES = ("rendezvous", "ada", "bo", "cy")  # the demo's children, as proc_mem labels them


def reply_finished(app: KafilaApp, chat: ChatPane) -> bool:
    """The last assistant message has ended (a short reply can end before a poll sees it streaming)."""
    replies = [m for m in app.dashboard.query(MessageView) if m.role == "assistant"]
    return bool(replies) and not chat.streaming and bool(replies[-1].body.strip() or replies[-1].error)


async def admitted_then_chat(app: KafilaApp, pilot: Any, text: str) -> MessageView:
    """Wait for admission, type `text` into the chat that opens, and return the finished reply."""
    await until(lambda: app.state.phase in ("admitted", "rejected", "lost"), timeout=300)
    assert app.state.phase == "admitted", app.state.rejection or app.state.lost
    await until(lambda: app.dashboard.active_tab == "chat")
    chat = app.dashboard.query_one(ChatPane)
    await pilot.press(*text, "enter")
    await until(lambda: reply_finished(app, chat), timeout=REPLY_TIMEOUT_S)  # a hang bound
    return [m for m in app.dashboard.query(MessageView) if m.role == "assistant"][-1]

async def test_live_demo_session_in_pilot(smollm: Path, demo_cache: Path) -> None:
    seeded = probe_files(demo_cache)
    # computed before the session starts: this loop runs the host, and must not block while it serves
    expected, expected_cli = llama_cpp_reply(smollm, "Hi", 8).strip(), llama_cpp_reply(smollm, "Hi", 6).strip()
    flow = partial(run_demo, DemoOptions(api_port=0))
    app = KafilaApp(flow=flow, mode="demo", settings=ChatSettings(max_tokens=8, temperature=0.0), tick_s=0.1)
    async with app.run_test(size=(100, 30)) as pilot:
        reply = await admitted_then_chat(app, pilot, "Hi")
        assert reply.error is None and reply.body.strip() == expected
        assert "tok/s" in screen_text(app)

        # The same session from outside: the attach path reads the real /kafila/state, and `kafila chat`
        # (a subprocess; this loop keeps serving the head meanwhile) chats through the real API.
        async with ApiClient(app.state.api_url or "") as api:
            seen = await api.state()
        assert seen.phase == "admitted" and set(seen.members) == set(app.state.members)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "kafila.py"), "chat", "--api", app.state.api_url or "", "--max-tokens", "6",
            "--temperature", "0", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=REPO)
        out, err = await asyncio.wait_for(proc.communicate(b"Hi\n/quit\n"), 240)
        assert proc.returncode == 0, err.decode()
        assert "kafila> " in out.decode() and "tok/s" in out.decode()
        assert expected_cli in out.decode(), out.decode()

        await pilot.press("f1")
        await pilot.pause()
        assert app.dashboard.query_one(DataTable).row_count == len(app.state.members) == 3
        assert "EMU" in screen_text(app)  # the demo's members are emulated slow-downs
        await pilot.press("f2")
        await pilot.pause()
        text = screen_text(app)
        assert "ring edges, verified with real packets" in text
        assert all(e.state in ("direct", "relayed") for e in app.state.edges)
        await pilot.press("f3")
        await pilot.pause()
        assert "◀" in screen_text(app) and app.state.plan and app.state.plan["feasible"]
        demo = [pid for pid, label in children().items() if label in DEMO_PROCESSES]
        assert len(demo) == len(DEMO_PROCESSES), children()
    # the app waited for its session to stop: the rendezvous outlived the app before, when textual
    # cancelled the flow at exit and the loop closed during its clean-up
    assert not [pid for pid in demo if alive(pid)], children()
    assert_demo_ran_in(demo_cache, seeded)


async def test_join_from_the_dashboard_chat_through_a_member_then_lose_the_session(tmp_path: Path,
                                                                                   smollm: Path) -> None:
    """`kafila tui --join`: this process is a member of a real session (host and another member are
    processes); the chat goes through this member's own API to the head; killing the (coordinate-only) host
    leaves the ring serving, and then killing the other member loses the session."""
    expected = llama_cpp_reply(smollm, "Hello", 6).strip()
    with Cluster(tmp_path, [("ada", [])], host_args=["--members", "2"]) as cluster:
        opts = MemberOptions(code=cluster.code, rendezvous=("127.0.0.1", cluster.port), name="tui-member",
                             api_port=0, cache_dir=tmp_path / "cache", join_timeout_s=180.0)
        app = KafilaApp(flow=partial(run_member, opts), mode="member",
                        settings=ChatSettings(max_tokens=6, temperature=0.0), tick_s=0.1)
        async with app.run_test(size=(100, 30)) as pilot:
            reply = await admitted_then_chat(app, pilot, "Hello")
            assert app.state.api_url and app.state.api_url != cluster.url  # this member's own endpoint
            assert reply.error is None and reply.body.strip() == expected

            cluster.host.popen.kill()  # the coordinator goes away: the ring serves on (it held no stage)
            await until(lambda: bool(app.state.coordinator_left), timeout=60)
            assert not isinstance(app.screen, LostScreen)
            cluster.members["ada"].popen.kill()  # with no host to re-plan, losing a member loses the session
            await until(lambda: isinstance(app.screen, LostScreen), timeout=60)
            await pilot.pause()
            assert "SESSION LOST" in screen_text(app)


async def test_live_rejection_shows_its_reasons(demo_cache: Path) -> None:
    """A real demo session asked for far more context than three members hold: rejected, with the remedies."""
    seeded = probe_files(demo_cache)
    flow = partial(run_demo, DemoOptions(api_port=0, concurrency=64, context=1_000_000))
    app = KafilaApp(flow=flow, mode="demo", tick_s=0.1)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(lambda: app.state.phase in ("admitted", "rejected", "lost"), timeout=300)
        assert app.state.phase == "rejected", app.state.lost
        await until(lambda: app.dashboard.active_tab == "admission")
        await pilot.pause()
        text = screen_text(app)
        assert "REJECTED" in text and "What would admit the session" in text
        assert app.dashboard.query_one("#prompt").disabled
    assert_demo_ran_in(demo_cache, seeded)

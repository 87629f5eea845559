"""The Kafila dashboard app: renders a SessionState; the session itself runs as a worker on the same loop.

Data flow ("attributes down, messages up"): the session code mutates a `SessionState`, whose
listener only marks the app dirty; a 4 Hz timer re-renders when dirty, so a burst of updates
(a probe, a delivery) costs one redraw and the loop is never blocked by rendering per change.
The session flow (`run_host`/`run_member`/demo) is an async worker here; its llama.cpp work runs
in its own threads. `--attach` polls a running session's `/kafila/state` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from kafila.errors import KafilaError, first_kafila_error
from kafila.session.state import SessionState
from kafila.stopping import STOP_DEADLINE_S
from kafila.tui.screens.dashboard import TABS, DashboardScreen
from kafila.tui.screens.lost import LostScreen
from kafila.tui.widgets.chat import ChatPane, ChatSettings

log = logging.getLogger("kafila.tui")

Flow = Callable[[SessionState], Awaitable[int]]
ACTIVE = ("starting", "waiting", "measuring", "planning", "delivering", "connecting", "admitted")


class KafilaApp(App[int]):
    """The dashboard. Give it a state to render, and optionally the flow that updates it or a URL to poll."""

    TITLE = "Kafila"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(f"f{i + 1}", f"open_tab('{tab}')", label, priority=True) for i, (tab, label) in enumerate(TABS)),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, state: SessionState | None = None, *, flow: Flow | None = None, attach: str | None = None,
                 mode: str = "", settings: ChatSettings | None = None, tick_s: float = 0.25) -> None:
        super().__init__()
        self.state = state or SessionState()
        self.flow, self.attach, self.mode, self.tick_s = flow, attach, mode, tick_s
        self.settings = settings or ChatSettings()
        self.status: int | None = None  # the flow's exit status once it returned
        self._dirty = True
        self._phase_seen: str | None = None
        self._attach_failures = 0
        self.rendered = False  # the first render (and its tab choice) happened
        self._session: Worker[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def on_mount(self) -> None:
        """Show the dashboard, start re-rendering on changes, and start the session or the poller."""
        self.dashboard = DashboardScreen(self.settings, self.mode)
        self.push_screen(self.dashboard)
        self.state.subscribe(self._changed)
        self.set_interval(self.tick_s, self._tick)
        if self.flow is not None:
            self._session = self.run_worker(self._run_flow(self.flow), name="session", group="session",
                                            exit_on_error=False)
        if self.attach is not None:
            self.run_worker(self._poll(self.attach), name="attach", group="session", exit_on_error=False)
        self.call_after_refresh(self._first_render)

    async def on_unmount(self) -> None:
        """Let the session flow finish its clean-up before the app returns.

        Textual cancels workers at exit without waiting for them, and the loop may close while the flow
        is still stopping: the demo's rendezvous was left running, and its pipe was collected after the
        loop closed. Bounded by the stop deadline; a flow still running then is abandoned as before.
        """
        if self._session is None:
            return
        self._session.cancel()
        with contextlib.suppress(WorkerCancelled, WorkerFailed, TimeoutError):
            await asyncio.wait_for(self._session.wait(), STOP_DEADLINE_S)

    def _first_render(self) -> None:
        self.render_state()
        if self._phase_seen not in ("admitted", "rejected"):  # those already moved the focus
            self.dashboard.open_tab(self.dashboard.active_tab)
        self.rendered = True

    def _changed(self, state: SessionState) -> None:
        # Called on the loop for every change; rendering waits for the next tick.
        self._dirty = True

    def _tick(self) -> None:
        # not before the first render: a tick can come before the dashboard's panes are mounted; nor once
        # the app shuts down: its screens are closed while the session still stops (on_unmount)
        if self._dirty and self.rendered and self.is_running:
            self.render_state()

    def set_state(self, state: SessionState) -> None:
        """Replace the rendered state (attach mode gets a new object per poll)."""
        self.state = state
        state.subscribe(self._changed)
        self._dirty = True

    def render_state(self) -> None:
        """Render now, and react to phase changes: admitted opens the chat, rejected the reasons, lost the dialog."""
        self._dirty = False
        self.dashboard.show(self.state)
        phase = self.state.phase
        if phase == self._phase_seen:
            return
        self._phase_seen = phase
        if phase == "admitted":
            self.dashboard.open_tab("chat")
        elif phase == "rejected":
            self.dashboard.open_tab("admission")
        elif phase == "lost":
            self.push_screen(LostScreen(self.state.lost or "the session ended"))

    def on_chat_pane_reply_finished(self, message: ChatPane.ReplyFinished) -> None:
        """A reply failed while another tab is shown: say so, the chat tab shows the details."""
        if message.error and self.dashboard.active_tab != "chat":
            self.notify(message.error, title="chat reply failed", severity="error", timeout=8)

    def action_open_tab(self, tab: str) -> None:
        """F1–F5: switch tabs (a dialog on top is closed first)."""
        if isinstance(self.screen, LostScreen):
            self.screen.dismiss(None)
        self.dashboard.open_tab(tab)

    # -- the session ---------------------------------------------------------------------------------
    async def _run_flow(self, flow: Flow) -> None:
        """Run the session; its failure becomes the "lost" state instead of a traceback over the screen."""
        state = self.state
        try:
            self.status = await flow(state)
        except Exception as exc:
            # a TaskGroup wraps the session's own end (SessionError …) in a group: its reason is still the reason
            reason = exc if isinstance(exc, KafilaError) else (
                first_kafila_error(exc) if isinstance(exc, BaseExceptionGroup) else None)
            if reason is not None:
                state.lost = str(reason)
                state.set_phase("lost", f"session ended: {reason}")
                return
            # any bug in the session must still leave a readable screen
            log.exception("session flow failed")
            state.lost = f"internal error: {exc!r} (details in the log)"
            state.set_phase("lost", state.lost)
            return
        if state.phase in ACTIVE:
            if self.status:
                state.lost = f"the session ended with status {self.status}"
                state.set_phase("lost", state.lost)
            else:
                state.set_phase("closed", "the session has ended")

    async def _poll(self, url: str, every_s: float = 0.5, give_up_after: int = 6) -> None:
        """Follow a running session through its API: its /kafila/state, twice a second."""
        from kafila.session.api.client import ApiClient

        async with ApiClient(url, connect_timeout=2, read_timeout=5) as api:
            while True:
                try:
                    got = await api.state()
                    got.api_url = url  # chat where we attached: that URL is known to answer from here
                    self._attach_failures = 0
                    self.set_state(got)
                except KafilaError as exc:
                    self._attach_failures += 1
                    if self._attach_failures >= give_up_after and self.state.phase != "lost":
                        self.state.lost = str(exc)
                        self.state.set_phase("lost", f"no answer from {url}")
                await asyncio.sleep(every_s)

"""The dashboard: the session bar, five tabs (Members, Reachability, Plan, Admission, Chat), the key footer."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from kafila.session.state import SessionState
from kafila.tui.widgets.admission import AdmissionPane
from kafila.tui.widgets.chat import ChatPane, ChatSettings
from kafila.tui.widgets.header import SessionBar
from kafila.tui.widgets.members import MembersPane
from kafila.tui.widgets.plan import PlanPane
from kafila.tui.widgets.reachability import ReachabilityPane

TABS = (("members", "Members"), ("reach", "Reachability"), ("plan", "Plan"), ("admission", "Admission"),
        ("chat", "Chat"))


PANES: dict[str, type[MembersPane | ReachabilityPane | PlanPane | AdmissionPane]] = {
    "members": MembersPane, "reach": ReachabilityPane, "plan": PlanPane, "admission": AdmissionPane}


class DashboardScreen(Screen[None]):
    """Renders a SessionState given to `show` into every tab."""

    DEFAULT_CSS = """
    DashboardScreen { layout: vertical; overflow: hidden; }
    DashboardScreen #tabs { height: 1fr; }
    DashboardScreen TabPane { height: 1fr; padding: 0; }
    DashboardScreen ContentSwitcher { height: 1fr; }
    """

    def __init__(self, settings: ChatSettings | None = None, mode: str = "") -> None:
        super().__init__()
        self.settings, self.mode = settings, mode
        self._state: SessionState | None = None

    def compose(self) -> ComposeResult:
        yield SessionBar(id="session-bar")
        with TabbedContent(initial="members", id="tabs"):
            with TabPane("Members", id="members"):
                yield MembersPane()
            with TabPane("Reachability", id="reach"):
                yield ReachabilityPane()
            with TabPane("Plan", id="plan"):
                yield PlanPane()
            with TabPane("Admission", id="admission"):
                yield AdmissionPane()
            with TabPane("Chat", id="chat"):
                yield ChatPane(self.settings)
        yield Footer()

    def show(self, state: SessionState) -> None:
        """Attributes down: the bar, the chat (it must know when it may send) and the visible tab render.

        Hidden tabs render when they are opened: the session's head may share this loop, so a
        token's state change should cost one pane's redraw, not five.
        """
        self._state = state
        self.query_one(SessionBar).show(state, self.mode)
        self.query_one(ChatPane).show(state)
        self._show_active()

    def _show_active(self) -> None:
        pane = PANES.get(self.active_tab)
        if pane is not None and self._state is not None:
            self.query_one(pane).show(self._state)

    @on(TabbedContent.TabActivated)
    def _tab_opened(self, event: TabbedContent.TabActivated) -> None:
        self._show_active()

    @property
    def active_tab(self) -> str:
        """The id of the tab shown."""
        return str(self.query_one(TabbedContent).active)

    def open_tab(self, tab: str) -> None:
        """Switch to a tab and move the keyboard focus into it (the prompt, for the chat).

        The focus must move: TabbedContent re-activates the tab that holds the focused widget.
        """
        self.query_one(TabbedContent).active = tab
        pane = self.query_one(f"#{tab}", TabPane)
        target = pane.query_one("#prompt") if tab == "chat" else None
        if target is None or target.disabled:
            target = next((w for w in pane.query("*") if w.focusable), None)
        self.set_focus(target)

"""The "session lost" dialog: what happened, where the transcripts are, and what to do next."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from kafila.session.terminal.transcripts import chats_dir, shown


class LostScreen(ModalScreen[None]):
    """Shown once when the session is lost; Esc returns to the (frozen) dashboard, Ctrl+Q quits."""

    DEFAULT_CSS = """
    LostScreen { align: center middle; }
    LostScreen > Vertical { width: 70; max-width: 95%; height: auto; border: heavy $error;
                            background: $surface; padding: 1 2; }
    LostScreen #lost-title { text-style: bold; color: $error; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Back to the dashboard"),
                                             Binding("ctrl+q", "app.quit", "Quit")]

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("SESSION LOST", id="lost-title")
            yield Static(Text(self.reason))
            yield Static(Text.assemble(
                "\nNothing you typed is lost: conversations are saved in\n", (shown(chats_dir()), "bold"),
                "\n\nStart a new session with `kafila tui --demo`, `--host` or `--join`.\n",
                ("Esc", "bold"), " look at the dashboard as it was · ", ("Ctrl+Q", "bold"), " quit"))

    def action_close(self) -> None:
        """Esc: back to the dashboard."""
        self.dismiss(None)

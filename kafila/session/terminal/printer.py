"""Running a session flow in a plain terminal: its events printed as they happen (the TUI is the other way)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from rich.console import Console

from kafila.session.state import SessionState
from kafila.stopping import cancelled_by_sigterm


class EventPrinter:
    """A state listener that prints each new event line once."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._printed = 0

    def __call__(self, state: SessionState) -> None:
        for t, text in state.events[self._printed:]:
            self.console.print(f"[dim]{time.strftime('%H:%M:%S', time.localtime(t))}[/] {text}", highlight=False)
        self._printed = len(state.events)


def run_printing(flow: Callable[[SessionState], Coroutine[Any, Any, int]], console: Console | None = None) -> int:
    """Run `flow` with a fresh state, printing its events; returns its exit status."""
    state = SessionState()
    state.subscribe(EventPrinter(console or Console(stderr=True)))
    try:
        return asyncio.run(cancelled_by_sigterm(flow(state)))
    except KeyboardInterrupt:
        return 130

"""Running a session flow in a plain terminal: its events printed as they happen (the TUI is the other way)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from rich.console import Console

from kafila.session.state import SessionState


def run_printing(flow: Callable[[SessionState], Awaitable[int]], console: Console | None = None) -> int:
    """Run `flow` with a fresh state, printing each new event line and the join code; returns its status."""
    console = console or Console(stderr=True)
    state = SessionState()
    printed = 0

    def show(s: SessionState) -> None:
        nonlocal printed
        for t, text in s.events[printed:]:
            console.print(f"[dim]{time.strftime('%H:%M:%S', time.localtime(t))}[/] {text}", highlight=False)
        printed = len(s.events)

    state.subscribe(show)
    try:
        return asyncio.run(flow(state))
    except KeyboardInterrupt:
        return 130

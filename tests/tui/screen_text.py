"""The text a running (headless) app shows, as a person would read it: for assertions on what is on screen."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from textual.app import App


def screen_text(app: App[Any]) -> str:
    """The current screen as plain text lines (the same render Textual's SVG export uses)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                      color_system="truecolor", legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()

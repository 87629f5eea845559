"""The one-line session bar at the top: role, phase, join code, model, members, who coordinates."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from kafila.session.state import SessionState
from kafila.tui.format import PHASE_STYLE


class SessionBar(Static):
    """Where the session stands, coloured by phase (green admitted, red rejected or lost)."""

    DEFAULT_CSS = """
    SessionBar { height: 1; background: $primary-background; color: $text; padding: 0 1; }
    """

    def show(self, state: SessionState, mode: str = "") -> None:
        """Render the bar for this state; `mode` says how the dashboard got it (demo, replay, …)."""
        style = PHASE_STYLE.get(state.phase, "bold white on dark_blue")
        text = Text()
        text.append(" KAFILA ", style="bold black on bright_cyan")
        text.append(f" {state.phase.upper()} ", style=style)
        parts = [mode, state.role + (f" {state.me}" if state.me and state.me != state.role else "")]
        if state.code:
            parts.append(f"code {state.code}")
        if state.model:
            parts.append(state.model)
        parts.append(f"{len(state.members)} member{'s' if len(state.members) != 1 else ''}")
        if state.plan and state.plan.get("head"):
            parts.append(f"head {state.plan['head']}")
        if state.coordinator_left and state.coordinator:
            parts.append(f"host left: {state.coordinator} coordinates")
        elif state.coordinator and state.role != "host":
            parts.append(f"coordinator {state.coordinator}")
        if state.rendezvous_unreachable:
            parts.append("rendezvous unreachable: direct edges only")
        if state.builds and state.builds.get("mode") == "mixed":
            parts.append(f"MIXED builds, not bit-exact ({', '.join(state.builds.get('differ') or {})} differ)")
        if state.tokens_per_s is not None and state.phase == "admitted":
            parts.append(f"{state.tokens_per_s:.1f} tok/s")
        text.append(" " + " · ".join(p for p in parts if p))
        self.update(text)
        self.set_class(state.phase == "lost", "-lost")

"""The Admission tab: the session's progress, then admitted (chat opens) or rejected (why, and what would admit it)."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from kafila.session.state import SessionState
from kafila.tui.format import gb, short, value_bar

STEPS = ("waiting", "measuring", "planning", "delivering", "connecting", "admitted")
REMEDY_PREFIXES = ("would admit", "or ", "no smaller", "a smaller", "try ", "fewer ", "shorter ")


def progress_text(phase: str) -> Text:
    """'✓waiting › ✓measuring › ●planning › delivering …' with the current step highlighted.

    A rejection stops the steps after planning, a loss after the last step reached.
    """
    t = Text()
    if phase in STEPS:
        current, stop = STEPS.index(phase), None
    elif phase == "rejected":
        current, stop = STEPS.index("delivering"), "✗ rejected"
    elif phase in ("lost", "closed"):
        current, stop = len(STEPS), "✗ lost" if phase == "lost" else "■ closed"
    else:
        current, stop = -1, None
    for i, step in enumerate(STEPS):
        if i:
            t.append(" › ", style="dim")
        if stop is not None and i == current:
            t.append(stop, style="bold white on red" if stop.startswith("✗") else "bold")
            break
        if i < current:
            t.append(f"✓{step}", style="green")
        elif i == current:
            t.append(f"●{step}", style="bold reverse")
        else:
            t.append(step, style="dim")
    else:
        if stop is not None:
            t.append(" › ", style="dim")
            t.append(stop, style="bold white on red" if stop.startswith("✗") else "bold")
    return t


def split_rejection(text: str) -> tuple[list[str], list[str]]:
    """The rejection's lines split into why it was rejected and what would admit the session."""
    why: list[str] = []
    remedies: list[str] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        (remedies if line.lower().startswith(REMEDY_PREFIXES) else why).append(line)
    return why, remedies


def rejection_block(text: str) -> RenderableType:
    """Reasons as a list, remedies under their own heading."""
    why, remedies = split_rejection(text)
    parts: list[RenderableType] = [Text("REJECTED", style="bold white on dark_red"), Text("Why", style="bold")]
    parts += [Text("• ") + Text(line) for line in why]
    if remedies:
        parts.append(Text("What would admit the session", style="bold green"))
        for line in remedies:
            # "would admit: A; or B; or C" reads better as one option per line.
            head, _, rest = line.partition(":")
            options = [o.strip() for o in rest.split(";")] if head.lower() == "would admit" and rest else [line]
            if line.lower().startswith("no "):  # what would not help, e.g. "no smaller quantisation helps"
                parts.append(Text("✗ " + line, style="dim"))
                continue
            parts += [Text("→ ", style="green") + Text(o.removeprefix("or ")) for o in options]
    return Group(*parts)


def delivery_block(state: SessionState, width: int) -> RenderableType | None:
    """A bar per member while stages are delivered."""
    if not state.delivery:
        return None
    rows: list[RenderableType] = [Text("stage delivery", style="bold")]
    for name, (done, total) in state.delivery.items():
        row = Text(f"{short(name, 16):<17}")
        row.append_text(value_bar(done, total or 1, max(width - 40, 10), "green" if done >= total else "cyan"))
        row.append(f" {done / total if total else 1.0:4.0%} of {gb(total)} GB")
        rows.append(row)
    return Group(*rows)


def outcome_block(state: SessionState) -> RenderableType:
    """What happened: admitted (and where the chat is), rejected (why), lost, or still on the way."""
    if state.phase == "rejected":
        return rejection_block(state.rejection or (state.plan or {}).get("reason") or "no reason given")
    if state.phase == "lost":
        return Group(Text("SESSION LOST", style="bold white on red"), Text(state.lost or "the session ended"))
    if state.phase == "admitted":
        t = Text("ADMITTED", style="bold white on dark_green")
        t.append(f"  the ring serves {state.model or 'the model'}")
        if state.api_url:
            t.append(f" at {state.api_url}")
        t.append(" — F5 opens the chat")
        return t
    if state.phase == "closed":
        return Text("The session has ended.", style="bold")
    return Text(f"The session is {state.phase}…", style="dim")


def events_text(events: list[tuple[float, str]], limit: int = 40) -> Text:
    """The newest events first (under the outcome, where they are seen without scrolling)."""
    t = Text("events, newest first\n", style="bold")
    for when, line in reversed(events[-limit:]):
        t.append(time.strftime("%H:%M:%S ", time.localtime(when)), style="dim")
        t.append(line.replace("\n", "\n         ") + "\n")
    return t


class AdmissionPane(VerticalScroll):
    """Progress through the phases, the outcome, and the session's event log."""

    DEFAULT_CSS = """
    AdmissionPane > Static { height: auto; padding: 0 1; margin-bottom: 1; }
    AdmissionPane #adm-events { border-top: solid $primary; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def compose(self) -> ComposeResult:
        yield Static(id="adm-progress")
        yield Static(id="adm-outcome")
        yield Static(id="adm-delivery")
        yield Static(id="adm-events")

    def show(self, state: SessionState) -> None:
        """Render the phase, the outcome and any new event lines."""
        self.query_one("#adm-progress", Static).update(progress_text(state.phase))
        self.query_one("#adm-outcome", Static).update(outcome_block(state))
        delivery = self.query_one("#adm-delivery", Static)
        block = delivery_block(state, self.size.width or 80)
        delivery.display = block is not None and state.phase in ("delivering", "connecting")
        if block is not None:
            delivery.update(block)
        self.query_one("#adm-events", Static).update(events_text(state.events))

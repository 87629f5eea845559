"""Pure text helpers for the dashboard: units, sparklines and bars drawn to scale. No Textual imports."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

SPARK = "▁▂▃▄▅▆▇█"
# One colour per ring position, so a member's blocks and its stage bar match across the plan screen.
PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta", "bright_green")
PHASE_STYLE = {
    "admitted": "bold white on dark_green",
    "rejected": "bold white on dark_red",
    "lost": "bold white on red",
    "closed": "bold white on grey37",
}


def gbps(bytes_per_s: float | None) -> str:
    """Bandwidth in GB/s, or a dash when not measured yet."""
    return "—" if bytes_per_s is None else f"{bytes_per_s / 1e9:.1f}"


def gb(nbytes: float | None) -> str:
    """Bytes in GB, or a dash."""
    return "—" if nbytes is None else f"{nbytes / 1e9:.1f}"


def ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds shown in milliseconds, or a dash."""
    return "—" if seconds is None else f"{seconds * 1000:.{digits}f}"


def pct(fraction: float | None) -> str:
    """A fraction as a whole percentage, or a dash."""
    return "—" if fraction is None else f"{fraction:.0%}"


def sparkline(samples: Sequence[float], width: int = 10) -> str:
    """The last `width` samples as block characters scaled to their own min..max."""
    tail = list(samples)[-width:]
    if not tail:
        return ""
    lo, hi = min(tail), max(tail)
    if hi <= lo:
        return SPARK[len(SPARK) // 2] * len(tail)
    top = len(SPARK) - 1
    return "".join(SPARK[round((v - lo) / (hi - lo) * top)] for v in tail)


def range_bar(start: int, end: int, total: int, width: int, style: str) -> Text:
    """`[start, end)` of `total` blocks drawn to scale in `width` cells; every range gets at least one cell."""
    width = max(width, 1)
    total = max(total, 1)
    a = min(round(start * width / total), width - 1)
    b = max(a + 1, min(round(end * width / total), width))
    text = Text("─" * a, style="grey35")
    text.append("█" * (b - a), style=style)
    text.append("─" * (width - b), style="grey35")
    return text


def value_bar(value: float, scale: float, width: int, style: str) -> Text:
    """`value` as a bar where `scale` fills `width` cells (eighth-cell resolution)."""
    if scale <= 0 or width <= 0:
        return Text(" " * max(width, 0))
    eighths = max(1, round(min(value / scale, 1.0) * width * 8)) if value > 0 else 0
    full, rest = divmod(eighths, 8)
    bar = "█" * full + (" ▏▎▍▌▋▊▉"[rest] if rest else "")
    return Text(bar.ljust(width), style=style)


def member_style(position: int) -> str:
    """The colour of the member at this ring position."""
    return PALETTE[position % len(PALETTE)]


def short(name: str, width: int) -> str:
    """A name cut to `width` cells with an ellipsis."""
    return name if len(name) <= width else name[: max(width - 1, 1)] + "…"

"""The Plan tab: ring order and head, block ranges to scale, stage-time bars with the bottleneck, baselines."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from kafila.session.state import SessionState
from kafila.tui.format import member_style, ms, pct, range_bar, short, value_bar

STRATEGY_TITLES = {"kafila": "Kafila", "uniform": "uniform split (GPipe-style)",
                   "memory": "memory-proportional (exo-style)"}
NAME_W = 16


def total_blocks(placement: dict[str, Any]) -> int:
    """k, the number of blocks: the largest range end."""
    return max((end for _, end in placement.get("ranges", {}).values()), default=0)


def bottleneck_member(placement: dict[str, Any]) -> str | None:
    """The member whose stage time is the bottleneck."""
    stages = placement.get("stage_seconds") or {}
    return max(stages, key=stages.__getitem__) if stages else None


def ring_text(placement: dict[str, Any]) -> Text:
    """'① head (head) → ② … → back to ①', each name in its ring colour."""
    order = placement.get("order") or []
    t = Text()
    for pos, name in enumerate(order):
        if pos:
            t.append(" → ")
        t.append(f"{pos + 1}:", style="dim")
        t.append(name, style=f"bold {member_style(pos)}")
        if name == placement.get("head"):
            t.append(" (head)", style="bold reverse")
    if order:
        t.append(" → back to 1", style="dim")
    return t


def placement_table(placement: dict[str, Any], width: int, measured: dict[str, float] | None = None) -> Table:
    """One row per member in ring order: range, the range drawn to scale, stage time as a bar, ◀ bottleneck."""
    k = total_blocks(placement)
    stages = placement.get("stage_seconds") or {}
    bottleneck = placement.get("bottleneck_seconds") or 0.0
    slow = bottleneck_member(placement)
    # Fixed columns take ~NAME_W + 8 + 7 + 4; the two bars share the rest.
    spare = max(width - NAME_W - 8 - 7 - 4 - 12, 16)
    blocks_w, stage_w = spare * 3 // 5, spare - spare * 3 // 5
    table = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
    table.add_column("member", no_wrap=True)
    table.add_column("blocks", no_wrap=True)
    table.add_column(f"0 … {k} to scale", no_wrap=True)
    table.add_column("stage ms", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    for pos, name in enumerate(placement.get("order") or []):
        style = member_style(pos)
        start, end = placement.get("ranges", {}).get(name, (0, 0))
        t = stages.get(name)
        label = Text(short(name, NAME_W), style=f"bold {style}")
        if name == placement.get("head"):
            label.append(" ⌂", style="bold")
        bar = value_bar(t or 0.0, bottleneck, stage_w, "bold yellow" if name == slow else style)
        time_cell = Text(ms(t))
        if measured and name in measured:
            time_cell.append(f" ({ms(measured[name])})", style="dim")
        if name == slow:
            time_cell.append(" ◀", style="bold yellow")
        table.add_row(label, f"[{start},{end})", range_bar(start, end, k, blocks_w, style), bar, time_cell)
    return table


def summary_text(placement: dict[str, Any]) -> Text:
    """Bottleneck (whose), utilisation and time per token around the ring."""
    t = Text()
    t.append("bottleneck ", style="bold")
    t.append(f"{ms(placement.get('bottleneck_seconds'))} ms", style="bold yellow")
    slow = bottleneck_member(placement)
    if slow:
        t.append(f" ({slow})")
    t.append(" · utilisation ", style="bold")
    t.append(pct(placement.get("utilisation")))
    t.append(" · circuit ", style="bold")
    t.append(f"{ms(placement.get('circuit_seconds'))} ms/token")
    return t


def ttft_text(placement: dict[str, Any], seen: dict[str, Any] | None = None) -> Text:
    """The plan's predicted time to first token and, once a request got one, the measured beside its prediction."""
    plan_ttft = placement.get("ttft") or {}
    t = Text()
    t.append("time to first token ", style="bold")
    if plan_ttft.get("seconds") is None:
        t.append("not predicted (a member measured no prefill)", style="dim")
    else:
        t.append(f"{plan_ttft['seconds']:.2f} s", style="bold")
        t.append(f" predicted for {plan_ttft['prompt_tokens']} prompt tokens")
    if seen:
        t.append(" · last request ", style="bold")
        t.append(f"{seen['measured_s']:.2f} s measured", style="bold cyan")
        pred = seen.get("predicted_s")
        t.append(f" vs {pred:.2f} s predicted" if pred is not None else "", style="")
        t.append(f" for its {seen['prompt_tokens']} tokens")
    return t


def replans_text(replans: list[dict[str, Any]]) -> Text:
    """Each time the ring was planned again though nobody was lost: around a member that ran slower (or faster)
    than planned, or to take in one that joined while it served."""
    t = Text()
    for r in replans:
        t.append("planned again: ", style="bold yellow")
        if r.get("why") == "joined":
            t.append(f"{r['member']} joined; slowest stage {ms(r.get('was_bottleneck_s'))} ms")
        else:
            factor = r["measured_s"] / r["predicted_s"] if r.get("predicted_s") else 0.0
            way = f"{factor:.1f}× slower" if factor >= 1 else f"{1 / factor:.1f}× faster" if factor else "off its plan"
            t.append(f"{r['member']} ran {way} than planned ({ms(r['measured_s'])} ms a call, "
                     f"predicted {ms(r['predicted_s'])} ms); slowest stage {ms(r.get('was_bottleneck_s'))} ms")
        if r.get("bottleneck_s") is not None:
            t.append(f" → {ms(r['bottleneck_s'])} ms predicted")
        t.append("\n")
    t.rstrip()
    return t


def comparison_table(plan: dict[str, Any]) -> Table:
    """Kafila against the two baselines: fits?, bottleneck, how many times slower, utilisation, why not."""
    ours = plan.get("bottleneck_seconds") if plan.get("feasible") else None
    table = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False, title="strategies side by side",
                  title_justify="left", title_style="bold")
    for col, justify in (("strategy", "left"), ("fits", "left"), ("bottleneck ms", "right"),
                         ("vs Kafila", "right"), ("utilisation", "right"), ("why not", "left")):
        table.add_column(col, justify=justify, no_wrap=col != "why not")  # type: ignore[arg-type]
    rows = [("kafila", plan), *(plan.get("baselines") or {}).items()]
    for name, p in rows:
        b = p.get("bottleneck_seconds") if p.get("feasible") else None
        ratio = "—" if b is None or not ours else f"{b / ours:.2f}×"
        why = "" if p.get("feasible") else (p.get("reason") or "").split(":")[0]
        table.add_row(Text(name, style="bold" if name == "kafila" else ""),
                      Text("yes", style="green") if p.get("feasible") else Text("no", style="bold red"),
                      ms(b), Text(ratio, style="yellow" if ratio not in ("—", "1.00×") else ""),
                      pct(p.get("utilisation") if p.get("feasible") else None), why)
    return table


def placement_block(title: str, placement: dict[str, Any], width: int,
                    measured: dict[str, float] | None = None, ttft: dict[str, Any] | None = None) -> RenderableType:
    """A strategy's ring, ranges, stage bars and summary; or, when it cannot place the model, why."""
    heading = Text(title, style="bold underline")
    if not placement.get("feasible"):
        return Group(heading, Text("cannot place the model: ", style="bold red") +
                     Text(placement.get("reason") or "no reason given"))
    return Group(heading, ring_text(placement), placement_table(placement, width, measured),
                 summary_text(placement), ttft_text(placement, ttft))


class PlanPane(VerticalScroll):
    """The chosen plan first, the strategy comparison, then each baseline drawn the same way."""

    DEFAULT_CSS = """
    PlanPane > Static { height: auto; padding: 0 1; margin-bottom: 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state: SessionState | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text("No plan yet: the host plans once the members have measured themselves.", style="dim"),
                     id="plan-main")
        yield Static(id="plan-compare")
        yield Static(id="plan-uniform")
        yield Static(id="plan-memory")

    def show(self, state: SessionState) -> None:
        """Render the plan in the state (nothing changes until there is one)."""
        self._state = state
        plan = state.plan
        if not plan:
            return
        width = max(self.size.width - 4, 60)
        measured = {n: s.measured_s for n, s in state.stages.items() if s.measured_s is not None}
        main = self.query_one("#plan-main", Static)
        if plan.get("feasible"):
            title = f"Kafila plan — head {plan.get('head')}, chosen among {len(plan.get('order') or [])} rotations"
            block = placement_block(title, plan, width, measured, state.ttft)
            if measured:
                block = Group(block, Text("stage ms: predicted (measured); ⌂ = head; ◀ = bottleneck", style="dim"))
            if state.replans:
                block = Group(block, replans_text(state.replans))
            main.update(block)
        else:
            main.update(placement_block("Kafila plan", plan, width))
        self.query_one("#plan-compare", Static).update(comparison_table(plan))
        baselines = plan.get("baselines") or {}
        for key in ("uniform", "memory"):
            widget = self.query_one(f"#plan-{key}", Static)
            if key in baselines:
                widget.update(placement_block(STRATEGY_TITLES[key], baselines[key], width))

    def on_resize(self) -> None:
        """Bars are drawn to the pane's width, so redraw when it changes."""
        if self._state is not None:
            self.show(self._state)

"""The Reachability tab: predicted direct/relay for every pair beside what the ring's edges turned out to be."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from kafila.planner.reachability import NatClass, all_direct_ring_exists
from kafila.session.state import EdgeView, SessionState
from kafila.tui.format import short

PREDICTED_STYLE = {"direct": "green", "relay": "yellow"}
VERIFIED_STYLE = {"pending": "grey50", "direct": "bold green", "relayed": "bold yellow", "failed": "bold red"}
WRONG_STYLE = "bold white on red"


def member_order(state: SessionState) -> list[str]:
    """Ring order when there is a plan (so ring edges sit next to the diagonal), else join order."""
    names = list(state.members) or list(state.predicted)
    order = [n for n in (state.plan or {}).get("order", []) if n in names or n in state.predicted]
    return order + [n for n in names if n not in order]


def ring_edges(state: SessionState) -> dict[frozenset[str], EdgeView]:
    """The ring's edges by unordered pair (the matrix is symmetric)."""
    return {frozenset((e.a, e.b)): e for e in state.edges}


def matrix_cell(state: SessionState, a: str, b: str, edges: dict[frozenset[str], EdgeView]) -> Text:
    """'D'/'R' predicted; a ring edge is bracketed and coloured by its verified state; '!' marks a wrong guess."""
    if a == b:
        return Text(" · ", style="grey35")
    predicted = state.predicted.get(a, {}).get(b) or state.predicted.get(b, {}).get(a)
    letter = {"direct": "D", "relay": "R"}.get(predicted or "", "?")
    edge = edges.get(frozenset((a, b)))
    if edge is None:
        return Text(f" {letter} ", style=PREDICTED_STYLE.get(predicted or "", "dim"))
    if edge.wrong:
        return Text(f"!{letter}!", style=WRONG_STYLE)
    return Text(f"[{letter}]", style=VERIFIED_STYLE.get(edge.state, ""))


def matrix_block(state: SessionState) -> Group:
    """The matrix under its heading (a table title would wrap to the narrow matrix's width)."""
    return Group(Text("predicted reachability", style="bold"), matrix_table(state))


def matrix_table(state: SessionState) -> Table:
    """The m×m matrix, rows named and numbered, columns numbered (narrow enough for 80 columns)."""
    names = member_order(state)
    edges = ring_edges(state)
    table = Table(box=None, padding=(0, 0), show_edge=False, pad_edge=False)
    table.add_column("", no_wrap=True)
    for i in range(len(names)):
        table.add_column(f"{i + 1:^3}", justify="center", no_wrap=True)
    for i, a in enumerate(names):
        table.add_row(Text(f"{i + 1} {short(a, 18)} "), *(matrix_cell(state, a, b, edges) for b in names))
    return table


def edges_table(state: SessionState) -> Table:
    """The ring's edges in ring order: predicted, verified, time to ready, round trip, and whether the guess held."""
    index = {name: i + 1 for i, name in enumerate(member_order(state))}
    table = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False,
                  title="ring edges, verified with real packets (times in ms)", title_justify="left",
                  title_style="bold")
    table.add_column("edge", no_wrap=True, min_width=4)
    table.add_column("predicted", no_wrap=True, min_width=9)
    table.add_column("verified", no_wrap=True, min_width=8)
    table.add_column("ready", justify="right", no_wrap=True, min_width=5)
    table.add_column("rtt", justify="right", no_wrap=True, min_width=5)  # QUIC's, once the edge is verified
    table.add_column("", no_wrap=True, min_width=7)
    table.add_column("members", no_wrap=True, overflow="ellipsis", ratio=1)
    for e in state.edges:
        if e.state == "pending":
            verdict = Text("…", style="grey50")
        elif e.wrong:
            verdict = Text("✗ WRONG", style=WRONG_STYLE)
        elif e.state == "failed":
            verdict = Text("✗ failed", style="bold red")
        else:
            verdict = Text("✓", style="green")
        table.add_row(f"{index.get(e.a, '?')}→{index.get(e.b, '?')}",
                      Text(e.predicted, style=PREDICTED_STYLE.get(e.predicted, "")),
                      Text(e.state, style=VERIFIED_STYLE.get(e.state, "")),
                      "—" if e.ready_ms is None else f"{e.ready_ms:.0f}",
                      "—" if e.rtt_ms is None else f"{e.rtt_ms:.1f}", verdict, f"{e.a} → {e.b}")
    return table


def counting_rule_text(state: SessionState) -> Text:
    """The NAT classes and whether the counting rule says an all-direct ring exists."""
    classes = [m.nat for m in state.members.values()]
    if not classes or any(c is None for c in classes):
        return Text("NAT classes: still probing", style="dim")
    counts = {c: classes.count(c) for c in ("permissive", "ordinary", "restrictive", "unknown") if c in classes}
    try:
        possible = all_direct_ring_exists(NatClass(c) for c in classes if c)
    except ValueError:
        return Text("NAT classes: " + ", ".join(f"{n} {c}" for c, n in counts.items()))
    t = Text("NAT classes: " + ", ".join(f"{n} {c}" for c, n in counts.items()) + " → an all-direct ring ")
    t.append("exists" if possible else "does not exist (some edges must be relayed)",
             style="green" if possible else "yellow")
    return t


LEGEND = Text.assemble(
    ("legend: ", "bold"), (" D ", "green"), "direct predicted  ", (" R ", "yellow"), "relay predicted  ",
    "[ ] a ring edge, coloured by what verification found: ", ("[D]", "bold green"), " direct ",
    ("[R]", "bold yellow"), " relayed ", ("[D]", "bold red"), " failed ", ("[D]", "grey50"), " pending  ",
    ("!D!", WRONG_STYLE), " the prediction was wrong",
)


class ReachabilityPane(VerticalScroll):
    """Matrix, edge table, counting rule and legend, stacked so they fit 80 columns."""

    DEFAULT_CSS = """
    ReachabilityPane > Static { height: auto; padding: 0 1; }
    ReachabilityPane #reach-edges { margin-top: 1; }
    ReachabilityPane #reach-legend { margin-top: 1; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="reach-matrix")
        yield Static(id="reach-edges")
        yield Static(id="reach-rule")
        yield Static(LEGEND, id="reach-legend")

    def show(self, state: SessionState) -> None:
        """Render the matrix and the edges for this state."""
        if not state.predicted and not state.members:
            self.query_one("#reach-matrix", Static).update(Text("No members yet.", style="dim"))
        else:
            self.query_one("#reach-matrix", Static).update(matrix_block(state))
        edges = self.query_one("#reach-edges", Static)
        edges.update(edges_table(state) if state.edges else
                     Text("The ring's edges are verified once there is a plan.", style="dim"))
        self.query_one("#reach-rule", Static).update(counting_rule_text(state))

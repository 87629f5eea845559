"""The Members tab: each member as it joins, with its measurements and a live probe sparkline."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from kafila.session.state import MemberView, SessionState
from kafila.tui.format import gb, gbps, ms, sparkline

COLUMNS = (("name", "member"), ("status", "status"), ("bw", "GB/s"), ("probe", "probe"), ("mem", "mem GB"),
           ("dispatch", "disp"), ("rtt", "RTT ms"), ("nat", "NAT"))
STATUS_STYLE = {"ready": "green", "serving": "bold green", "measuring": "yellow", "measured": "green",
                "loading": "cyan", "joined": "", "lost": "bold red", "refused": "bold red"}
EMULATED = "magenta"


def emulation_text(view: MemberView) -> Text:
    """'EMULATED ÷4 bw, 24 GB' in magenta, or a dim dash for a member measured as it is."""
    if not view.emulated:
        return Text("—", style="dim")
    bits = []
    if view.emulated.get("throttle", 1) not in (None, 1, 1.0):
        bits.append(f"÷{view.emulated['throttle']:g} bw")  # bandwidth divided by the throttle
    if view.emulated.get("memory_gb") is not None:
        bits.append(f"≤{view.emulated['memory_gb']:g} GB")
    if view.emulated.get("link_delay_ms"):
        bits.append(f"+{view.emulated['link_delay_ms']:g} ms")  # every datagram it sends, that much later
    link = view.emulated.get("link_mbit")
    if isinstance(link, list) and len(link) == 2 and all(isinstance(x, int | float) for x in link):  # up, down
        bits.append(f"link {link[0]:g}" + ("" if link[0] == link[1] else f"/{link[1]:g}") + " Mbit/s")
    return Text("EMULATED " + " ".join(bits), style=f"bold {EMULATED}")


def row_cells(view: MemberView) -> dict[str, Text]:
    """The table cells of one member, keyed by column."""
    emu = bool(view.emulated)
    throttled = emu and view.emulated.get("throttle", 1) not in (None, 1, 1.0)
    capped = emu and view.emulated.get("memory_gb") is not None
    name = Text(view.name + (" (host)" if view.role == "host" else ""), style="bold")
    if emu:
        name.append(" EMU", style=f"bold reverse {EMULATED}")  # visible even where the last column is not
    return {
        "name": name,
        "status": Text(view.status, style=STATUS_STYLE.get(view.status, "")),
        "bw": Text(gbps(view.bandwidth_bytes_per_s) + ("*" if throttled else ""),
                   style=EMULATED if throttled else "", justify="right"),
        "probe": Text(sparkline(view.probe_samples, 5), style="cyan"),  # 5: the NAT column fits 80 columns
        "mem": Text(gb(view.memory_bytes) + ("*" if capped else ""), style=EMULATED if capped else "",
                    justify="right"),
        "dispatch": Text(ms(view.dispatch_s), justify="right"),
        "rtt": Text("—" if view.rtt_ms is None else f"{view.rtt_ms:.1f}", justify="right"),
        "nat": Text(view.nat or "probing…", style="" if view.nat else "dim"),
    }


def detail_text(view: MemberView) -> Text:
    """The highlighted member in full: NAT evidence, build, note, emulation."""
    t = Text()
    t.append(view.name, style="bold")
    t.append(f"  {view.role}, {view.status}")
    if view.build:
        t.append(f"  build {view.build}", style="dim")
    t.append("\nNAT ")
    t.append(view.nat or "not classified yet", style="bold")
    if view.nat_evidence:
        t.append(" from: " + ", ".join(f"{k}={v}" for k, v in view.nat_evidence.items()), style="dim")
    if view.prefill.get("prow"):
        p = view.prefill
        t.append(f"\nprefill per {p['prow']:g}-row call: {p.get('pdisp', 0) * 1e3:.1f} ms + "
                 f"{p.get('pblk', 0) * 1e3:.1f} ms/block + bytes at {p.get('pbw', 0) / 1e9:.3f} GB/s")
        if view.expert_rates:
            t.append("; routed experts " + ", ".join(f"{kind} {rate / 1e9:.3f} GB/s"
                                                     for kind, rate in sorted(view.expert_rates.items())))
    if view.machine:
        t.append(f"\nmachine {view.machine}", style="dim")
        t.append(" (members on one machine share its cores)", style="dim")
    if view.emulated:
        t.append("\n")
        t.append_text(emulation_text(view))
        t.append(" — the * numbers are what the session was told to emulate, not this machine's own",
                 style=EMULATED)
    if view.note:
        t.append(f"\n{view.note}", style="italic")
    return t


class MembersPane(Vertical):
    """A table with one stable row per member, and the highlighted member's details and probe below.

    Emulated numbers are magenta with a * and the name carries an EMU tag; the detail spells out what
    was emulated.
    """

    DEFAULT_CSS = """
    MembersPane DataTable { height: auto; max-height: 60%; }
    MembersPane #member-detail { height: auto; padding: 0 1; }
    MembersPane #probe-label { height: 1; padding: 0 1; color: $text-muted; }
    MembersPane Sparkline { height: 2; margin: 0 1; }
    MembersPane #members-empty { padding: 1 2; color: $text-muted; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._state: SessionState | None = None
        self._selected: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("Waiting for members to join…", id="members-empty")
        table: DataTable[Text] = DataTable(cursor_type="row", zebra_stripes=True, id="members-table")
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        yield table
        yield Static(id="member-detail")
        yield Static(id="probe-label")
        yield Sparkline([], id="probe")

    def show(self, state: SessionState) -> None:
        """Add rows for new members and update the cells of known ones (no clear: keeps the cursor)."""
        self._state = state
        table: DataTable[Text] = self.query_one(DataTable)
        members = list(state.members.values())
        self.query_one("#members-empty").display = not members
        self.query_one(Sparkline).display = bool(members)
        known = {str(key.value) for key in table.rows}
        for view in members:
            cells = row_cells(view)
            if view.name in known:
                for key, value in cells.items():
                    # a cell that grows (joined → serving) widens its column instead of being cut
                    table.update_cell(view.name, key, value, update_width=True)
            else:
                table.add_row(*(cells[key] for key, _ in COLUMNS), key=view.name)
        for gone in known - {m.name for m in members}:
            table.remove_row(gone)
        if self._selected not in state.members and members:
            self._selected = members[0].name
        self._show_detail()

    def _show_detail(self) -> None:
        view = self._state.members.get(self._selected or "") if self._state else None
        self.query_one("#member-detail", Static).update(detail_text(view) if view else "")
        samples = view.probe_samples if view else []
        label = ""
        if view is not None:
            last = f", last {samples[-1] / 1e9:.1f} GB/s" if samples else ""
            label = f"bandwidth probe: {len(samples)} calls{last}" if samples else "bandwidth probe: not run yet"
        self.query_one("#probe-label", Static).update(label)
        self.query_one(Sparkline).data = list(samples)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Follow the cursor: the detail and sparkline show the highlighted member."""
        self._selected = event.row_key.value
        self._show_detail()

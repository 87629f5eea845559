"""The layout's rules, checked on the code itself: file sizes, room sizes, no import circles, layers.

The import graph is grimp's, which reads every import statement, those inside functions too: a
circle closed by a lazy import is still a circle a reader has to hold in their head.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 450
MAX_ROOM_MODULES = 12

# Highest first; a module may import from its own layer or any below it, never from one above.
# Within a layer, siblings may import each other (the circle check still applies).
TOP_LAYERS: tuple[tuple[str, ...], ...] = (
    ("kafila.__main__", "kafila.cli", "kafila.commands", "kafila.bench"),
    ("kafila.tui",),
    ("kafila.session", "kafila.lab"),
    ("rendezvous",),
    ("kafila.net",),
    ("kafila.engine", "kafila.planner"),
    ("kafila.model",),
    ("kafila.config", "kafila.process", "kafila.stopping", "kafila.errors"),
)
SESSION_LAYERS: tuple[tuple[str, ...], ...] = (
    *((f"kafila.session.{room}",)
      for room in ("terminal", "launch", "member", "coordinator", "api", "ring", "delivery", "protocol")),
    ("kafila.session.state", "kafila.session.options", "kafila.session.settings", "kafila.session.phases",
     "kafila.session.emulation", "kafila.session.stoppable"),
)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    g = grimp.build_graph("kafila", "rendezvous")
    # grimp reads the launcher script kafila.py, beside the package, as the package's own imports;
    # kafila/__init__.py imports nothing, and the launcher is not part of any layer.
    for imported in g.find_modules_directly_imported_by("kafila"):
        g.remove_import(importer="kafila", imported=imported)
    return g


def _sources() -> list[Path]:
    return sorted([*(REPO / "kafila").rglob("*.py"), *(REPO / "rendezvous").rglob("*.py")])


def _layer_of(module: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    for i, layer in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return i
    return None


def _upward(graph: grimp.ImportGraph, layers: tuple[tuple[str, ...], ...], within: str = "") -> list[str]:
    bad = []
    for importer in sorted(graph.modules):
        if not importer.startswith(within):
            continue
        mine = _layer_of(importer, layers)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            theirs = _layer_of(imported, layers)
            if mine is not None and theirs is not None and theirs < mine:
                lines = [d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)]
                bad.append(f"{importer} (line {lines}) imports {imported}, a layer above it")
    return bad


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_file_over_the_limit() -> None:
    long = {str(p.relative_to(REPO)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_session_rooms_stay_small() -> None:
    rooms = [REPO / "kafila/session", *(p for p in (REPO / "kafila/session").iterdir() if p.is_dir())]
    big = {}
    for room in rooms:
        modules = [p for p in room.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_ROOM_MODULES:
            big[str(room.relative_to(REPO))] = len(modules)
    assert not big, f"rooms of more than {MAX_ROOM_MODULES} modules: {big}"


def test_no_import_circles(graph: grimp.ImportGraph) -> None:
    assert _cycles(graph) == []


def test_no_import_from_a_layer_above(graph: grimp.ImportGraph) -> None:
    assert _upward(graph, TOP_LAYERS) == []
    assert _upward(graph, SESSION_LAYERS, within="kafila.session") == []


def test_every_package_has_a_layer(graph: grimp.ImportGraph) -> None:
    """A new top-level package or session room must be placed in the layers above, or it is unchecked."""
    unplaced = sorted(m for m in graph.modules if m != "kafila" and _layer_of(m, TOP_LAYERS) is None)
    unplaced += sorted(
        m for m in graph.modules
        if m.startswith("kafila.session.") and _layer_of(m, SESSION_LAYERS) is None
    )
    assert unplaced == []


def test_the_checks_can_fail() -> None:
    """The circle and layer checks, on a graph made to break them."""
    g = grimp.ImportGraph()
    for m in ("kafila.net.a", "kafila.net.b", "kafila.session.member.x", "kafila.session.ring.y"):
        g.add_module(m)
    g.add_import(importer="kafila.net.a", imported="kafila.net.b", line_number=1, line_contents="import b")
    g.add_import(importer="kafila.net.b", imported="kafila.net.a", line_number=1, line_contents="import a")
    g.add_import(importer="kafila.net.a", imported="kafila.session.member.x", line_number=2, line_contents="x")
    g.add_import(importer="kafila.session.ring.y", imported="kafila.session.member.x", line_number=3, line_contents="")
    assert _cycles(g) == [["kafila.net.a", "kafila.net.b"]]
    assert len(_upward(g, TOP_LAYERS)) == 1
    assert len(_upward(g, SESSION_LAYERS, within="kafila.session")) == 1

"""Every test is in one of the two tiers, so none silently stops running.

`make test` runs the fast tier (`-m "not slow"`), `make test-slow` the slow one (`-m slow`), CI both. A test
file declares its tier itself: a module-level `pytestmark` holding `pytest.mark.fast` or `pytest.mark.slow`,
or one of the two on every test function (tests/conftest.py makes a slow test in a fast file slow only).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import COLLECTED, TIERS

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _tiers(node: ast.AST) -> set[str]:
    """The tiers named in an expression: `pytest.mark.slow`, `[pytest.mark.slow, pytest.mark.timeout(60)]`..."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in TIERS
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def _pytestmark(body: list[ast.stmt]) -> set[str]:
    """The tiers in a `pytestmark = ...` among these statements (a module's or a class's)."""
    found: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        else:
            continue
        if stmt.value is not None and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            found |= _tiers(stmt.value)
    return found


def _tests(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [s for s in body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name.startswith("test")]


def untiered(source: str) -> list[str]:
    """What in a test file's source declares no tier: its test functions (or the file itself, named by "*")."""
    tree = ast.parse(source)
    module = _pytestmark(tree.body)
    if module == set(TIERS):
        return ["* (the module is marked both fast and slow)"]
    missing = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
            cls = module | _pytestmark(stmt.body) | {t for d in stmt.decorator_list for t in _tiers(d)}
            missing += [f"{stmt.name}.{f.name}" for f in _tests(stmt.body)
                        if not cls | {t for d in f.decorator_list for t in _tiers(d)}]
    missing += [f.name for f in _tests(tree.body) if not module | {t for d in f.decorator_list for t in _tiers(d)}]
    return missing


def test_files_without_a_tier_are_found() -> None:
    assert untiered("import pytest\n\ndef test_a(): pass\n") == ["test_a"]
    assert untiered("import pytest\npytestmark = pytest.mark.slow\n\ndef test_a(): pass\n") == []
    listed = "import pytest\npytestmark = [pytest.mark.timeout(9), pytest.mark.fast]\n\ndef test_a(): pass\n"
    assert untiered(listed) == []
    assert untiered("import pytest\npytestmark = pytest.mark.timeout(9)\n\ndef test_a(): pass\n") == ["test_a"]
    each = "import pytest\n\n@pytest.mark.slow\ndef test_a(): pass\n\n@pytest.mark.fast\nasync def test_b(): pass\n"
    assert untiered(each) == []
    assert untiered(each + "\ndef test_c(): pass\n") == ["test_c"]
    assert untiered("import pytest\n\nclass TestX:\n    def test_a(self): pass\n") == ["TestX.test_a"]
    assert untiered("import pytest\n\n@pytest.mark.fast\nclass TestX:\n    def test_a(self): pass\n") == []
    both = "import pytest\npytestmark = [pytest.mark.fast, pytest.mark.slow]\n\ndef test_a(): pass\n"
    assert untiered(both) != []


def test_every_test_file_declares_its_tier() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100  # the walk found the suite
    missing = {str(f.relative_to(REPO)): m for f in files if (m := untiered(f.read_text()))}
    assert not missing, f"declare a tier (pytestmark = pytest.mark.fast or .slow) in: {missing}"


def test_every_collected_test_carries_a_tier(request: pytest.FixtureRequest) -> None:
    """Checked on this run's own collection when it took in every test file (`make test`); else on a fresh one."""
    collected = request.config.stash.get(COLLECTED, None)
    files = {str(f.relative_to(REPO)) for f in TESTS.rglob("test_*.py")}
    if collected is not None and files <= collected.files:
        assert not collected.untiered, f"tests in neither tier: {collected.untiered}"
        return
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "not fast and not slow", "tests"], capture_output=True, text=True, cwd=REPO,
                         timeout=600)
    # exit status 5: nothing selected, that is no test outside both tiers (and no collection error)
    assert run.returncode == 5, f"tests in neither tier, or an error:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"

"""Shared fixtures: the embedded model, tiny synthetic models, an isolated stage cache."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from kafila.model.embedded import default_model_path
from kafila.model.stage_cache import StageCache
from kafila.session.phases import STRICT_ENV
from tests.synthetic import write_synthetic

REPO = Path(__file__).resolve().parent.parent
# an illegal phase change raises in every test, and in every process a test starts (kafila/session/phases.py)
os.environ[STRICT_ENV] = "1"
TIERS = ("fast", "slow")


@dataclass(frozen=True)
class Collected:
    """What this run collected before `-m` chose its tier: the test files, and the tests in neither tier."""

    files: frozenset[str]
    untiered: tuple[str, ...]


COLLECTED: pytest.StashKey[Collected] = pytest.StashKey()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the fast tier is `-m "not slow"`, `-m fast` the same set
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test is in exactly one tier (tests/test_tiers.py checks that each file declares one).

    A file may declare `pytestmark = pytest.mark.fast` and mark its few slow tests `@pytest.mark.slow`:
    such a test is slow only, so the module's (or class's) `fast` moves down onto its other tests.
    Tests with neither mark are recorded for tests/test_tiers.py.
    """
    both = [item for item in items if item.get_closest_marker("slow") and item.get_closest_marker("fast")]
    holders = {node for item in both for node in item.listchain() if any(m.name == "fast" for m in node.own_markers)}
    for node in holders:
        node.own_markers[:] = [m for m in node.own_markers if m.name != "fast"]
    for item in items:
        if item.get_closest_marker("slow") is None and holders.intersection(item.listchain()):
            item.add_marker(pytest.mark.fast)
    config.stash[COLLECTED] = Collected(
        frozenset(item.nodeid.split("::")[0] for item in items),
        tuple(item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)))


# Hypothesis: no per-example deadline (200 ms by default, which a loaded machine misses without any bug);
# CI (CI=true) tries more examples where a test does not set its own count. HYPOTHESIS_PROFILE=dev|ci chooses.
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.register_profile("ci", deadline=None, max_examples=400, print_blob=True)


@pytest.fixture(scope="session")
def smollm() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def synthetic_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny random model per supported architecture, plus an untied-output llama."""
    d = tmp_path_factory.mktemp("synthetic")
    archs = ("llama", "qwen2", "qwen3")
    models = {arch: write_synthetic(d / f"{arch}.gguf", arch, seed=i) for i, arch in enumerate(archs)}
    models["llama-untied"] = write_synthetic(d / "llama-untied.gguf", "llama", seed=7, tied=False)
    return models


@pytest.fixture(scope="session")
def stage_cache(tmp_path_factory: pytest.TempPathFactory) -> StageCache:
    return StageCache(tmp_path_factory.mktemp("stage-cache"))


@contextlib.contextmanager
def reference_llama(model: Path, n_ctx: int = 512, **options: Any) -> Iterator[Any]:
    """llama-cpp-python's own `Llama` on the whole file, the tests' ground truth; closed on leaving."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()  # the same llama.cpp build Kafila loads (and its log routed before Llama() would print it)
    ref = Llama(str(model), n_ctx=n_ctx, verbose=False, **options)
    try:
        yield ref
    finally:
        ref.close()


def llama_cpp_reply(model: Path, prompt: str, max_tokens: int, n_ctx: int = 512) -> str:
    """Ground truth for a greedy chat reply: llama-cpp-python's own completion on the whole file."""
    with reference_llama(model, n_ctx) as ref:
        out = ref.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0)
        return str(out["choices"][0]["message"]["content"])


def in_ci() -> bool:
    """Whether this is CI (`.ci/run` sets CI=true; any value but empty, 0 or false counts)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "dev"))


def missing_tool(why: str) -> None:
    """A test cannot run here for want of a system tool: skip on a developer's machine, fail in CI.

    CI (`.ci/run` sets CI=true) installs every tool the tests use (`make sysdeps`), so a skip there
    would only hide that a test never ran.
    """
    if in_ci():
        pytest.fail(f"CI must run this test: {why}")
    pytest.skip(why)


def run_kafila(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `python kafila.py ARGS` as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, str(REPO / "kafila.py"), *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def processes_marked(*markers: str) -> dict[int, str]:
    """Live processes whose command line or environment holds one of `markers` (paths unique to a test).

    Like `pgrep -f MARKER`, plus the environment: every process a run starts inherits its HOME,
    TMPDIR and KAFILA_CACHE_DIR, whatever its command line says.
    """
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, a zombie, or someone else's
            continue
        if any(m.encode() in cmdline or m.encode() in environ for m in markers):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found

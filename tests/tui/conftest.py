"""Fixtures for the TUI and chat tests: an isolated data dir and the real API server with a scripted ring."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.tui.demo_cache import seeded_demo_cache
from tests.tui.scripted_api import Script, start


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes transcripts under its own tmp dir, never the user's."""
    d = tmp_path / "kafila-data"
    monkeypatch.setenv("KAFILA_DATA_DIR", str(d))
    return d


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
async def api(script: Script) -> AsyncIterator[str]:
    """The real API server in the test's loop, its chats answered by `script`; yields its base URL."""
    server, url = await start(script)
    try:
        yield url
    finally:
        await server.stop()


@pytest.fixture
def demo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache of a test that runs the demo: its own, seeded with the shared probe (tests.tui.demo_cache);
    KAFILA_CACHE_DIR names it, for a demo run in this process and for every process started from here."""
    cache = seeded_demo_cache(tmp_path / "cache")
    monkeypatch.setenv("KAFILA_CACHE_DIR", str(cache))
    return cache

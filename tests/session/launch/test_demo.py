"""The demo flow: the model shown by its file's name; cancelling it ends everything it started, its host
task included."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from kafila.model.embedded import default_model_path
from kafila.session.launch.demo import DemoOptions, run_demo
from kafila.session.state import SessionState
from tests.conftest import processes_marked
from tests.shared_probe import shared_probe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("demo-cache")
    shared_probe(cache, DemoOptions().member_threads())  # the probe the demo's members use
    return cache


async def test_the_demo_shows_the_model_file_and_cancelling_it_ends_everything(demo_cache: Path) -> None:
    state = SessionState()
    opened = asyncio.Event()
    state.subscribe(lambda s: opened.set() if s.code else None)
    demo = asyncio.create_task(run_demo(DemoOptions(api_port=0, cache_dir=demo_cache), state))
    done, _ = await asyncio.wait({demo, asyncio.ensure_future(opened.wait())}, timeout=300,
                                 return_when=asyncio.FIRST_COMPLETED)
    assert demo not in done and state.code, "the demo ended before its host opened a session"
    # the file's name, not the GGUF's general.name slug ("Smollm2 135M 8k Lc100K Mix1 Ep2")
    assert state.model == default_model_path().stem == "SmolLM2-135M-Instruct.Q4_1"
    demo.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await demo
    left = [t for t in asyncio.all_tasks() if not t.done() and "run_host" in repr(t.get_coro())]
    assert left == [], "the demo's host outlived the demo"
    assert processes_marked(str(demo_cache)) == {}

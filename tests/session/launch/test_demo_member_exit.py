"""A demo member whose process dies says so in the session's log, with the last line it wrote, instead of
leaving the demo waiting in silence (a member's crash shows only in its own log file)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kafila.session.launch.demo import DemoMember, DemoOptions, run_demo
from kafila.session.terminal.background import SessionThread
from tests.shared_probe import shared_probe

pytestmark = pytest.mark.slow


def test_a_member_that_crashes_at_start_is_named_in_the_session_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken-build" / "llama_cpp"  # a llama.cpp build that aborts on load
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("import os, sys\nprint('llama.cpp: cannot load', file=sys.stderr)\n"
                                        "sys.stderr.flush()\nos.abort()\n")
    members = (DemoMember("ada"), DemoMember("bo", llama_path=broken.parent))
    opts = DemoOptions(members=members, api_port=None, context=512, cache_dir=tmp_path / "cache")
    shared_probe(tmp_path / "cache", opts.member_threads())
    said = threading.Event()
    session = SessionThread(lambda state: run_demo(opts, state))
    session.state.subscribe(lambda s: said.set() if any("bo's process ended" in t for _, t in s.events) else None)
    with session:
        assert said.wait(120), [t for _, t in session.state.events]
        line = next(t for _, t in session.state.events if "bo's process ended" in t)
    assert "killed by signal 6" in line and line.endswith("llama.cpp: cannot load"), line
    assert not any("ada's process ended" in t for _, t in session.state.events)  # only the one that died

"""EMULATION: `kafila demo --link-rate MBIT` caps each member's connection: a stage takes at least its size over
the rate to arrive, every member's log and the demo's JSON say its connection is emulated, and the reply is still
llama.cpp's own."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.launch.demo_json import demo_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = "Say hi"
TOKENS = 8
MBIT = 40  # 5 MB/s: SmolLM2's stages of 27-45 MB take 5-9 s


def test_a_demo_on_slow_connections_delivers_at_their_rate(tmp_path: Path, smollm: Path) -> None:
    doc = demo_json(tmp_path, PROMPT, TOKENS, "--link-rate", str(MBIT))
    assert doc["text"] == llama_cpp_reply(smollm, PROMPT, TOKENS, 2048)
    for name, member in doc["members"].items():
        assert member["emulated"]["link_mbit"] == [MBIT, MBIT], member  # the demo's JSON labels it emulated
        log = (tmp_path / "demo-logs" / f"{name}.log").read_text()
        assert f"this machine's connection: {MBIT} Mbit/s (emulated)" in log, log
        start = re.search(r"^(\d\d:\d\d:\d\d) asking the host for [\d.]+ MB of stage", log, re.M)
        done = re.search(r"^(\d\d:\d\d:\d\d) stage \w+ verified \(([\d.]+) MB\)", log, re.M)
        assert start and done, log
        took = (datetime.strptime(done[1], "%H:%M:%S") - datetime.strptime(start[1], "%H:%M:%S")).seconds
        # the stage cannot have come faster than the emulated downlink (the log's clock has whole seconds); on
        # loopback without it, it comes in a second or two
        assert took >= float(done[2]) * 1e6 / (MBIT * 1e6 / 8) - 1, (name, took, done[0])

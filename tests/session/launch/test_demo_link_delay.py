"""EMULATION: `kafila demo --link-delay MS` holds every datagram each member sends for MS: the ring's edges then
measure the round trip a WAN would have, and the demo's JSON sets one token's predicted time (stages plus half
of each edge's measured round trip) beside the measured one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kafila.session.launch.demo import DemoOptions
from tests.conftest import REPO, llama_cpp_reply
from tests.shared_probe import shared_probe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = "What is the capital of France?"
DELAY_MS = 20


def test_a_demo_with_link_delays_replies_as_llama_cpp_and_predicts_the_edges(tmp_path: Path, smollm: Path) -> None:
    shared_probe(tmp_path, DemoOptions().member_threads())
    env = {**os.environ, "KAFILA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(REPO / "kafila.py"), "demo", "--prompt", PROMPT, "--max-tokens", "24",
                          "--temperature", "0", "--json", "--api-port", "0", "--throttle", "1,1,1",
                          "--link-delay", str(DELAY_MS)], capture_output=True, text=True, env=env, timeout=800)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["text"] == llama_cpp_reply(smollm, PROMPT, 24, 2048)
    assert all(m["emulated"]["link_delay_ms"] == DELAY_MS for m in doc["members"].values()), doc["members"]
    t = doc["token_time"]
    # three edges, each a round trip of two delayed sends: a token cannot go round faster than half of them
    assert t["edges_s"] >= 3 * DELAY_MS / 1e3, t
    assert t["predicted_s"] == pytest.approx(t["stages_s"] + t["edges_s"])
    assert t["measured_s"] >= t["edges_s"], t
    print("token time", t)

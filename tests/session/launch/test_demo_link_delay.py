"""EMULATION: `kafila demo --link-delay MS` holds every datagram each member sends for MS: the ring's edges then
measure the round trip a WAN would have, and the demo's JSON sets one token's predicted time (stages plus half
of each edge's measured round trip) beside the measured one. Speculation by lookup then carries several of a
reply's tokens round the ring at once, and the reply is still llama.cpp's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.bench.wan import GROUNDED
from tests.conftest import llama_cpp_reply
from tests.session.launch.demo_json import demo_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = GROUNDED["edit"]  # the reply copies the paragraph: lookup drafts most of it
DELAY_MS = 40
TOKENS = 48


def test_a_demo_far_apart_replies_as_llama_cpp_with_several_tokens_a_circuit(tmp_path: Path, smollm: Path) -> None:
    doc = demo_json(tmp_path, PROMPT, TOKENS, "--link-delay", str(DELAY_MS), "--speculate", "lookup")
    assert doc["text"] == llama_cpp_reply(smollm, PROMPT, TOKENS, 2048)
    assert all(m["emulated"]["link_delay_ms"] == DELAY_MS for m in doc["members"].values()), doc["members"]
    t, spec = doc["token_time"], doc["speculation"]
    # three edges, each a round trip of two delayed sends: a circuit cannot go round faster than half of them
    assert t["edges_s"] >= 3 * DELAY_MS / 1e3, t
    assert t["predicted_s"] == pytest.approx(t["stages_s"] + t["edges_s"])
    decode_s = (doc["completion_tokens"] - 1) / doc["tokens_per_s"]
    assert decode_s / spec["circuits"] >= t["edges_s"], (decode_s, spec)
    # ... and speculation carried more than one token a circuit: a token took less than the edges' time
    assert spec["mode"] == "lookup" and spec["accepted"] > 0, spec
    assert decode_s / (doc["completion_tokens"] - 1) < t["edges_s"], (decode_s, spec, t)
    print("token time", t, "speculation", spec)

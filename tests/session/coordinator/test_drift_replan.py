"""A member that slows down while serving (EMULATION: `--throttle-schedule`) is planned around.

Real processes on loopback: a coordinate-only host and three members, one of which runs 4x slower from
SLOW_AT s after it first served. Replies keep the ring decoding; once the slow member's stage has run
at least 1.5x its prediction for 30 s (kafila.session.coordinator.drift), the host plans again with the
measured numbers: the slow member holds fewer blocks, `/kafila/state` says who and by how much, and
the replies cut by the new plan go on with exactly llama.cpp's tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.session.coordinator.drift import HOLD_S
from tests.conftest import llama_cpp_reply
from tests.session.cluster import BackToBack, Cluster, reply_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SLOW_AT = 5
STORY = "Tell me a long story about a dragon."
TOKENS = 64


def test_a_member_4x_slower_mid_session_is_planned_around(tmp_path: Path, smollm: Path) -> None:
    reference = llama_cpp_reply(smollm, STORY, TOKENS, 1024)
    members = [("ada", []), ("bo", []), ("cy", ["--throttle-schedule", f"0:1,{SLOW_AT}:4"])]
    with Cluster(tmp_path, members) as cluster:
        before = cluster.wait_phase({"admitted"})["plan"]
        # the ring decodes all along: a drift is measured only while it computes
        with BackToBack(cluster, STORY, TOKENS) as decoding:
            # another member may be planned around first: a probe that predicted its stage far off (seen once:
            # the head 1.9x faster than predicted) is a drift too
            state = cluster.wait_state(cluster.url, lambda s: any(r["member"] == "cy" for r in s["replans"]),
                                       SLOW_AT + 2 * HOLD_S + 120)
            after = cluster.wait_phase({"admitted"}, 240)
            decoding.more(2, 240)  # replies served on after it
        replies = decoding.replies
        replan = next(r for r in state["replans"] if r["member"] == "cy")
        assert replan["measured_s"] >= 1.5 * replan["predicted_s"], (replan, cluster.host.output[-3000:])
        blocks = {p: {n: r[1] - r[0] for n, r in plan["ranges"].items()} for p, plan in
                  (("before", before), ("after", after["plan"]))}
        assert blocks["after"]["cy"] < blocks["before"]["cy"], blocks
        assert after["plan"]["stage_seconds"]["cy"] > 0
        assert any("planned again" in text for _, text in after["events"]), after["events"][-5:]
        # no reply failed: each one, cut by the new plan or not, is llama.cpp's text
        assert replies and all(reply_text(r) == reference for r in replies), [reply_text(r) for r in replies]
        cut = [r for r in replies if any("notice" in (c.get("kafila") or {}) for _, c in r[:-1])]
        assert all("planned again" in next(c["kafila"]["notice"] for _, c in r[:-1] if "notice" in c.get("kafila", {}))
                   for r in cut), cut

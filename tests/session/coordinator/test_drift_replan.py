"""A member that slows down while serving (EMULATION: `--throttle-schedule`) is planned around.

Real processes on loopback: a coordinate-only host and three members, one of which runs 4x slower from
SLOW_AT s after it first served. Replies keep the ring decoding; once the slow member's stage has run
at least 1.5x its prediction for 30 s (kafila.session.coordinator.drift), the host plans again with the
measured numbers: the slow member holds fewer blocks, `/kafila/state` says who and by how much, and
the replies cut by the new plan go on with exactly llama.cpp's tokens, and a reply on the new plan runs at
(at least 0.9 times) the speed the plan's stage times give (with the ring's own time outside them).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kafila.session.coordinator.drift import HOLD_S
from kafila.session.launch.demo import SHARED_MACHINE_ENV
from kafila.session.state import SessionState
from tests.conftest import llama_cpp_reply
from tests.session.cluster import BackToBack, Cluster, reply_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SLOW_AT = 5
REPLAN_WITHIN_S = 60  # issue 32: the ring re-plans within a minute of a member's slow-down
STORY = "Tell me a long story about a dragon."
TOKENS = 64


def test_a_member_4x_slower_mid_session_is_planned_around(tmp_path: Path, smollm: Path) -> None:
    reference = llama_cpp_reply(smollm, STORY, TOKENS, 1024)
    # the members share this machine's cores as the demo's do (one thread each, llama.cpp's idle threads not
    # spinning long), so that each stage computes at the speed its plan predicts
    one = ["--threads", "1"]
    members = [("ada", one), ("bo", one), ("cy", [*one, "--throttle-schedule", f"0:1,{SLOW_AT}:4"])]
    with Cluster(tmp_path, members, member_env={n: SHARED_MACHINE_ENV for n, _ in members}) as cluster:
        before = cluster.wait_phase({"admitted"})["plan"]
        serving = time.monotonic()  # cy serves from about now: it slows down SLOW_AT s later
        # the ring decodes all along: a drift is measured only while it computes
        with BackToBack(cluster, STORY, TOKENS) as decoding:
            # another member may be planned around first: a probe that predicted its stage far off (seen once:
            # the head 1.9x faster than predicted) is a drift too
            state = cluster.wait_state(cluster.url, lambda s: any(r["member"] == "cy" for r in s["replans"]),
                                       SLOW_AT + 2 * HOLD_S + 120)
            replanned_after = time.monotonic() - serving - SLOW_AT
            # the new plan admitted (the phase may still read "admitted" of the old one for a moment)
            after = cluster.wait_state(cluster.url, lambda s: s["phase"] == "admitted"
                                       and s["plan"]["ranges"] != before["ranges"], 240)
            decoding.more(2, 240)  # replies served on after it: the last one wholly on the new plan
        # the new ring's head has reported its circuits by now (each second): the edges' share of a token
        final = SessionState.from_json(cluster.state(cluster.url))
        replies = decoding.replies
        assert replanned_after <= REPLAN_WITHIN_S, replanned_after
        # the new plan's speed is what the ring then does: the reply's typical token (its median interval) against
        # the token the plan predicts, its stage times plus this reply's own time outside the stages. The ring's
        # circuits are not the plan's to predict: beside another job loading both cores, the wake-ups each hop
        # waits for put 9.5 ms a token outside compute where the circuits' running medians said 6.5 (the
        # stages within 6 % of their plan), and the mean interval carries a longer tail still. So this
        # holds every stage to its plan: a member left at 4x on its old blocks misses it by far.
        last = replies[-1]
        stats = next(c["kafila"] for _, c in reversed(last[:-1])
                     if (c.get("kafila") or {}).get("token_interval_median_ms"))
        interval = stats["token_interval_median_ms"] / 1e3
        stages = {n: (v["predicted_s"], v["measured_s"] or 0.0) for n, v in stats["stages"].items()}
        outside = interval - sum(m for _, m in stages.values())
        token_s = sum(p for p, _ in stages.values()) + outside
        measured = 1 / interval
        # issue 32: at least 0.9x (every member is planned again at its measured speed: drift.measured_speed)
        print(f"RATIO {measured * token_s:.3f} (mean {stats['tokens_per_s'] * token_s:.3f}; against the circuits' "
              f"figure {measured * (final.token_time() or {}).get('predicted_s', 0.0):.3f})")
        assert measured >= 0.9 / token_s, (measured, 1 / token_s, stages, outside, final.circuit_gap_s,
                                           [e.get("rtt_ms") for e in after["edges"]], len(after["replans"]))
        print(f"re-planned {replanned_after:.1f} s after the slow-down; {measured:.1f} tok/s against "
              f"{1 / token_s:.1f} predicted")
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

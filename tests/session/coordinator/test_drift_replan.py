"""A member that slows down while serving (EMULATION: `--throttle-schedule`) is planned around.

Real processes on loopback: a coordinate-only host and three members, one of which runs 4x slower from
SLOW_AT s after it first served. Replies keep the ring decoding; once the slow member's stage has run
at least 1.5x its prediction for 30 s (kafila.session.coordinator.drift), or another's first, the host
plans again with every member at its measured speed: the slow member holds fewer blocks within 60 s of
its slow-down, `/kafila/state` says who called for the plan and how far each member was off, the
replies cut by the new plan go on with exactly llama.cpp's tokens. Whether the ring then measures the cut
of its slowest stage the host planned for is `kafila bench drift`'s (slowest_stage_cut).

How close the new plan's predicted speed comes to the ring's is a speed target, so `kafila bench drift`
measures it (issue 32: at least 0.9x). It is no test's to assert: beside another job loading the cores a
stage's slow-down grows with its call's length (a member measured 1.75x slower on 4 blocks ran 3.5x slower
on 16-20), which one speed factor a member cannot express, and the ring then ran at 0.61-0.87 of its plan.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kafila.bench.drift import cy_slower
from kafila.session.coordinator.drift import HOLD_S
from kafila.session.launch.demo import SHARED_MACHINE_ENV
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
            # the first new plan that takes cy at its measured speed: one a drift of cy's called for, or one another
            # member's called for first (a probe that predicted a stage far off is a drift too, and beside another
            # job loading the cores most are), which takes every member at its measured speed
            state = cluster.wait_state(cluster.url, lambda s: any(cy_slower(r) for r in s["replans"]),
                                       SLOW_AT + 2 * HOLD_S + 120)
            replanned_after = time.monotonic() - serving - SLOW_AT
            i = next(i for i, r in enumerate(state["replans"]) if cy_slower(r))
            # that plan admitted: its predicted slowest stage is set as it is made, before its ring is admitted
            after = cluster.wait_state(cluster.url, lambda s: s["phase"] == "admitted"
                                       and "bottleneck_s" in s["replans"][i], 240)
            decoding.more(2, 240)  # replies served on after it: the last one wholly on the new plan
        replies = decoding.replies
        assert replanned_after <= REPLAN_WITHIN_S, replanned_after
        # the last reply ran wholly on the new plan: its stages' running medians against the slowest stage the
        # host measured when it planned again. Whether the ring then measures the cut the host planned for is a
        # speed target, `kafila bench drift`'s (slowest_stage_cut, at most 1 - GAIN): beside another job loading
        # the cores a plan that took cy rightly (1.01x against ada's 0.39x and bo's 0.20x, one shared probe having
        # over-predicted every stage) still ran its slowest stage at 19.8 ms, not the 6.5 ms it predicted.
        stats = next(c["kafila"] for _, c in reversed(replies[-1][:-1]) if (c.get("kafila") or {}).get("stages"))
        stages = {n: (v["predicted_s"], v["measured_s"]) for n, v in stats["stages"].items()}
        replan = after["replans"][i]
        slowest = max(m or 0.0 for _, m in stages.values())
        print(f"SLOWEST {slowest / replan['was_bottleneck_s']:.3f} of the stage that called for the plan "
              f"({slowest * 1e3:.1f} ms against {replan['was_bottleneck_s'] * 1e3:.1f} ms); re-planned "
              f"{replanned_after:.1f} s after the slow-down for {replan['member']}, replans {after['replans']}")
        assert all(m for _, m in stages.values()), stages
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

"""A member that joins while the ring serves (a friend arriving late) is held, then planned in when that cuts
the slowest stage by 10 % or more; the reply streaming meanwhile goes on with exactly llama.cpp's tokens.

Real processes on loopback: a coordinate-only host and four members serving SmolLM2's 30 blocks, each
emulating a machine 2x slower than this one. First a member 40x slower joins: even one block of it would
be the slowest stage (the others' ~8 blocks at 2x take 16 block-times, its one 40; at 8x its two blocks
came within the 10 % bar and measured noise planned it in), so it waits. Then one at this machine's
speed, mid-reply: it can take the most blocks, so the host plans again, without the slow one (which must
not hold the fast one back).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.cluster import REPLY_TIMEOUT_S, BackToBack, Cluster, reply_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STORY = "Tell me a long story about a dragon."
TOKENS = 150
JOIN_AFTER_CHARS = 120  # about 30 tokens of the reply have arrived when the fifth member starts


def test_a_fifth_member_joining_mid_reply_is_planned_in_and_the_reply_goes_on(tmp_path: Path, smollm: Path) -> None:
    reference = llama_cpp_reply(smollm, STORY, TOKENS, 1024)
    with Cluster(tmp_path, [(n, ["--throttle", "2"]) for n in ("ada", "bo", "cy", "dee")]) as cluster:
        before = cluster.wait_phase({"admitted"})["plan"]
        # replies back to back: the new plan cuts one of them (the gaps between them are milliseconds)
        with BackToBack(cluster, STORY, TOKENS, JOIN_AFTER_CHARS) as replies:
            assert replies.streaming.wait(REPLY_TIMEOUT_S), "no reply streamed"
            cluster.join("fay", ["--throttle", "40"])
            waits = cluster.wait_state(cluster.url, lambda s: any("fay waits" in text for _, text in s["events"]),
                                       240)
            # fay is not planned in (a drift's re-plan on a loaded machine may have reordered the four meanwhile)
            assert waits["phase"] == "admitted" and sorted(waits["plan"]["order"]) == sorted(before["order"]), \
                waits["events"][-8:]
            cluster.join("eve")
            state = cluster.wait_state(cluster.url, lambda s: s["phase"] == "admitted" and "eve" in s["plan"]["order"],
                                       240)
            replies.more(2, 360)  # served on the five-member ring (within the test's own timeout)
        replan = next(r for r in state["replans"] if r["member"] == "eve")
        assert replan["why"] == "joined" and replan["bottleneck_s"] <= 0.9 * replan["was_bottleneck_s"], replan
        # (on a loaded machine a stage may also drift from its plan and be planned around: not an arrival)
        assert "fay" not in state["plan"]["order"] and \
            [r["member"] for r in state["replans"] if r.get("why") == "joined"] == ["eve"], state["replans"]
        ranges = state["plan"]["ranges"]
        assert max(e - a for n, (a, e) in ranges.items() if n != "eve") < \
            max(e - a for a, e in before["ranges"].values()), (before["ranges"], ranges)
        # no reply failed: each one, cut by the new plan or not, is llama.cpp's text; the cut one says why
        assert all(reply_text(r) == reference for r in replies.replies), \
            ([reply_text(r) for r in replies.replies], cluster.host.output[-3000:])
        notices = [c["kafila"]["notice"] for r in replies.replies for _, c in r[:-1] if "notice" in c.get("kafila", {})]
        assert sum("eve joined" in n for n in notices) == 1 and all("planned again" in n for n in notices), notices

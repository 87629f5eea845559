"""The host waits for stages by progress, not by a clock: a member whose stage arrives slowly (in all
longer than the stall limit) is admitted, while a member that makes no progress at all is named and
the host plans again without it. Real processes on loopback; the slow and the stalled member are
`kafila join` with one function patched.

The stall limit is the clock under test; the slow member's pace is derived from it: its link pauses
1/STALL_MARGIN of the limit per chunk, so a loaded machine would have to stretch one chunk's handling
STALL_MARGIN-fold for it to look stalled (a fixed 0.5 s pause against a 5 s limit left a loaded machine
a margin of 4.5 s). That its stage took longer than the limit in all is checked by its bytes, not timed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.session.cluster import Cluster

pytestmark = pytest.mark.slow

STALL_LIMIT_S = 10
STALL_MARGIN = 20
CHUNK_PAUSE_S = STALL_LIMIT_S / STALL_MARGIN  # bo's link takes this long per 1 MiB chunk

# bo reads its stage's chunks slowly, as over a slow link: progress, but slow
SLOW = f"""
import asyncio, sys
import kafila.session.member.stage as member
real = member.receive_stage
class SlowLink:
    def __init__(self, link):
        self.link = link
    async def recv(self, timeout=None):
        await asyncio.sleep({CHUNK_PAUSE_S})
        return await self.link.recv(timeout)
async def slow(link, *args, **kwargs):
    return await real(SlowLink(link), *args, **kwargs)
member.receive_stage = slow
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""

# cy is alive and connected, but never asks for its stage: no progress at all
STALLED = """
import asyncio, sys
import kafila.session.member.stage as member
async def never(self, *args):
    await asyncio.Event().wait()
member.Stages.receive_stage = never
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_slow_delivery_succeeds_and_a_stalled_member_is_named(tmp_path: Path) -> None:
    with Cluster(tmp_path, [("ada", []), ("bo", []), ("cy", [])], scripts={"bo": SLOW, "cy": STALLED},
                 host_args=["--stall-limit", str(STALL_LIMIT_S)]) as cluster:
        state = cluster.wait_phase({"admitted"}, timeout=600)
        out = cluster.host.output
        assert sorted(state["plan"]["order"]) == ["ada", "bo"], out
        assert f"cy made no progress for {STALL_LIMIT_S} s while receiving its stage (0.0 of" in out, out
        assert "member cy was lost" in out
        assert "bo made no progress" not in out and "ada made no progress" not in out
        # bo's stage took longer than the stall limit by construction: every chunk paused its receiver
        bo_bytes = state["delivery"]["bo"][1]
        assert bo_bytes / (1 << 20) * CHUNK_PAUSE_S > STALL_LIMIT_S, bo_bytes
        reply = cluster.chat("Hello", max_tokens=4)
        assert reply["choices"][0]["message"]["content"], reply

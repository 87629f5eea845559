"""A chat that reaches the head before its ring serves is answered, not dropped.

The host sends a chat as soon as it has admitted the ring, and a member can read that chat in the same
turn as its admission, before the task that makes its head has run. It was dropped, and its client waited
for an answer forever (seen once in 80 runs of the killed-member test: the resumed reply never came).
Here every member's serving starts SERVE_DELAY_S late, so the test's first chat is sure to arrive first;
the script says so on stderr when it does. Real processes on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.cluster import Cluster

pytestmark = pytest.mark.slow

SERVE_DELAY_S = 4.0
PROMPT = "What is the capital of France?"
EARLY = "CHAT BEFORE THE HEAD"

LATE_SERVE = f"""
import asyncio, sys
import kafila.session.member.runtime as member
serve, on_chat = member.MemberRuntime._serve, member.MemberRuntime._on_chat
async def late(self):
    await asyncio.sleep({SERVE_DELAY_S})
    await serve(self)
async def noted(self, msg):
    if self.head is None:
        print({EARLY!r}, file=sys.stderr, flush=True)
    await on_chat(self, msg)
member.MemberRuntime._serve = late
member.MemberRuntime._on_chat = noted
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_chat_sent_with_the_admission_is_answered(tmp_path: Path, smollm: Path) -> None:
    expected = llama_cpp_reply(smollm, PROMPT, 8)
    names = ("ada", "bo")
    with Cluster(tmp_path, [(n, []) for n in names], scripts=dict.fromkeys(names, LATE_SERVE)) as cluster:
        state = cluster.wait_phase({"admitted"})
        reply = cluster.chat(PROMPT, 8, timeout=120)  # the head serves SERVE_DELAY_S after its admission
        head = cluster.members[state["plan"]["head"]]
        assert EARLY in head.output, head.output[-3000:]  # the chat did come before the head
        assert reply["choices"][0]["message"]["content"] == expected, reply
        again = cluster.chat(PROMPT, 8, timeout=120)  # and the ring serves on as usual
        assert again["choices"][0]["message"]["content"] == expected, again

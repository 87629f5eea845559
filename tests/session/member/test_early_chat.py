"""A chat that reaches the head before its ring serves is answered, not dropped.

The host sends a chat as soon as it has admitted the ring, and a member can read that chat in the same
turn as its admission, before the task that makes its head has run. It was dropped, and its client waited
for an answer forever (seen once in 80 runs of the killed-member test: the resumed reply never came).
Here the head's serving waits for the test's first chat to reach it (the event, not a clock: a fixed
delay was outlasted by a loaded machine's chat), so that chat surely arrives before the head exists; the
script says so on stderr when it does. The other members serve at once. Real processes on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.cluster import Cluster

pytestmark = pytest.mark.slow

HANG_S = 240  # a bound on a hang only: the head serves without the chat after this long (and the test fails)
PROMPT = "What is the capital of France?"
EARLY = "CHAT BEFORE THE HEAD"

LATE_SERVE = f"""
import asyncio, sys
import kafila.session.member.serving as member
serve, on_chat = member.RingService.serve, member.RingService.chat
chatted = asyncio.Event()
async def late(self):
    if self._assigned.head == self.opts.name:  # the head serves once the first chat has reached it
        try:
            await asyncio.wait_for(chatted.wait(), {HANG_S})
        except TimeoutError:
            pass
    await serve(self)
async def noted(self, msg, *args):
    if self.head is None:
        print({EARLY!r}, file=sys.stderr, flush=True)
    chatted.set()
    await on_chat(self, msg, *args)
member.RingService.serve = late
member.RingService.chat = noted
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_chat_sent_with_the_admission_is_answered(tmp_path: Path, smollm: Path) -> None:
    expected = llama_cpp_reply(smollm, PROMPT, 8)
    names = ("ada", "bo")
    with Cluster(tmp_path, [(n, []) for n in names], scripts=dict.fromkeys(names, LATE_SERVE)) as cluster:
        state = cluster.wait_phase({"admitted"})
        reply = cluster.chat(PROMPT, 8)  # the head serves once this chat has reached it
        head = cluster.members[state["plan"]["head"]]
        assert EARLY in head.output, head.output[-3000:]  # the chat did come before the head
        assert "choices" in reply and reply["choices"][0]["message"]["content"] == expected, reply
        again = cluster.chat(PROMPT, 8)  # and the ring serves on as usual
        assert again["choices"][0]["message"]["content"] == expected, again

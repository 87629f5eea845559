"""A member that learns of a loss from its coordinator's `lost` message names the lost member to the requests
waiting through its API (issue 34 item 7): the API server counts lost heads by that name and never sends a
request that two lost heads were serving to a third (it may be what killed them). Before, only a loss the
member saw on its own ring edge was named; one reported by the host re-sent the request every time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafila.session.api.server import Forwarder
from kafila.session.protocol import messages
from tests.session.scripted import member

pytestmark = pytest.mark.fast


async def test_a_loss_the_host_reports_is_named_to_the_waiting_requests(tmp_path: Path) -> None:
    async with member(tmp_path, "ada", others=[]) as m:
        sent: list[bytes] = []

        async def send(msg: bytes) -> None:
            sent.append(msg)

        m.runtime.ring.forwarder = Forwarder("ada", send)  # as while it serves: its API's requests go to the head
        replies = m.runtime.ring.forwarder.chat({"messages": [{"role": "user", "content": "hi"}]})
        first = asyncio.create_task(anext(replies))
        async with asyncio.timeout(30):
            while not sent:
                await asyncio.sleep(0.01)
        await m.host.send(messages.Lost("bo", "its machine went to sleep", 0))
        evt = await asyncio.wait_for(first, 30)
        assert evt == {"error": "member bo was lost: its machine went to sleep", "resumable": True, "lost": "bo"}
        await replies.aclose()
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0

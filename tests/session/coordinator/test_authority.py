"""Who may tell the coordinator what (issue 55, findings 1 and 5), on the real coordinator with scripted
members over real QUIC links (tests/session/scripted.py), a ring of four serving:

- a `lost` report from a member that is not a ring neighbour of the member it names changes nothing;
- a neighbour's report about a member that answers the coordinator's ping evicts nobody (everyone is planned
  again); the same report about a member gone silent, as a killed process is, loses it;
- `stats` and `chat_evt` count only from the head: another member can neither write into a reply the
  coordinator's API waits for nor set the ring's figures.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafila.session.protocol import messages
from kafila.session.protocol.authority import ring_neighbours
from tests.session.scripted import WAIT_S, Coordinated, coordinator, silence
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast

NAMES = ["ada", "bo", "cy", "dan"]
QUIET_S = 1.0  # how long a refused message is given to do harm (a bound on a wrong re-plan, not a speed check)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_synthetic(tmp_path / "tiny.gguf", "llama", n_blocks=8)


def far_from(c: Coordinated, who: str) -> str:
    """A member of the serving ring that is neither `who` nor one of its neighbours."""
    order = c.runtime.machine.order
    return next(n for n in order if n != who and n not in ring_neighbours(order, who))


async def test_a_report_from_a_member_that_is_not_a_neighbour_evicts_nobody(tmp_path: Path, model: Path) -> None:
    async with coordinator(tmp_path, model, NAMES) as c:
        epoch = await c.reach("admitted")
        head = c.runtime.machine.order[0]
        liar = far_from(c, head)
        await c.members[liar].send(messages.Lost(head, "a lie", epoch))
        await asyncio.sleep(QUIET_S)
        assert c.state.phase == "admitted" and c.runtime.machine.epoch == epoch, c.log()
        assert sorted(c.runtime.machine.order) == NAMES and "a lie" not in c.log()


async def test_a_neighbours_report_about_a_member_that_answers_evicts_nobody(tmp_path: Path, model: Path) -> None:
    async with coordinator(tmp_path, model, NAMES) as c:
        epoch = await c.reach("admitted")
        order = c.runtime.machine.order
        who, reporter = order[1], order[2]  # ring neighbours
        await c.members[reporter].send(messages.Lost(who, "its ring edge failed", epoch))
        again = await c.reach("admitted", after_epoch=epoch)
        assert sorted(c.runtime.machine.order) == NAMES, c.log()  # everyone planned again: the ring did not shrink
        assert f"but {who} answers the coordinator: nobody is evicted" in c.log()
        assert "was lost" not in c.log() and again == epoch + 1
        assert not any(c.members[n].inbox.of(messages.Lost) for n in NAMES)


async def test_a_neighbours_report_about_a_silent_member_loses_it(tmp_path: Path, model: Path) -> None:
    async with coordinator(tmp_path, model, NAMES) as c:
        epoch = await c.reach("admitted")
        order = c.runtime.machine.order
        who, reporter = order[1], order[2]
        silence(c.members[who].ep)
        await c.members[reporter].send(messages.Lost(who, "its ring edge failed", epoch))
        await c.reach("admitted", after_epoch=epoch)
        assert sorted(c.runtime.machine.order) == sorted(n for n in NAMES if n != who), c.log()
        assert c.state.members[who].status == "lost"


async def test_chat_events_and_stats_count_only_from_the_head(tmp_path: Path, model: Path) -> None:
    async with coordinator(tmp_path, model, NAMES) as c:
        await c.reach("admitted")
        head, other = c.runtime.machine.order[0], c.runtime.machine.order[2]
        forwarder = c.runtime.forwarder
        assert forwarder is not None
        reply = forwarder.chat({"messages": [{"role": "user", "content": "hi"}]})
        first = asyncio.ensure_future(anext(reply))
        chat = await c.members[head].inbox.first(messages.Chat)
        assert chat.origin == "host"
        await c.members[other].send(messages.ChatEvt(chat.id, chat.origin, {"delta": "forged", "tokens": [1]}))
        await c.members[other].send(messages.Stats({}, 0.5, 12345.0))
        await asyncio.sleep(QUIET_S)  # both reach the coordinator before the head's answer
        await c.members[head].send(messages.ChatEvt(chat.id, chat.origin, {"delta": "real", "tokens": [2]}))
        assert (await asyncio.wait_for(first, WAIT_S))["delta"] == "real"
        assert c.state.tokens_per_s != 12345.0
        await c.members[head].send(messages.Stats({}, 0.5, 7.0))
        async with asyncio.timeout(WAIT_S):
            while c.state.tokens_per_s != 7.0:
                await asyncio.sleep(0.05)
        await reply.aclose()

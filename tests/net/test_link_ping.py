"""Link.ping: the coordinator's check that a member reported lost is there (issue 55, finding 1), on real QUIC
links over loopback: acknowledged while the peer's endpoint runs, unanswered once it is silent as a killed
process is, False at once on a closed link."""

from __future__ import annotations

import asyncio

import pytest

from tests.net.linked import linked

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]
BOUND_S = 2.0  # the ping's bound here: a live peer on loopback answers in milliseconds


async def test_a_live_peer_answers_a_ping_every_time() -> None:
    async with linked() as (_, _b, link, _theirs):
        assert all([await link.ping(BOUND_S) for _ in range(5)])


async def test_a_silent_peer_leaves_the_ping_unanswered_within_its_bound() -> None:
    async with linked() as (_, b, link, _theirs):
        assert b._socket is not None
        b._socket.close()  # neither reads nor sends again, as after kill -9
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert not await link.ping(BOUND_S)
        assert loop.time() - started < 2 * BOUND_S  # the bound holds (a hang would fail the timeout instead)


async def test_a_closed_link_answers_no_ping() -> None:
    async with linked() as (_, _b, link, _theirs):
        await link.close()
        assert not await link.ping(BOUND_S)

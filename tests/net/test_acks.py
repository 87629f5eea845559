"""A ring edge acknowledges every second datagram (Link.ack_every_second), the other within ACK_LATE_S, over real
QUIC on loopback: what the sender holds unacknowledged is the ground truth."""

from __future__ import annotations

import asyncio

import pytest

from kafila.net.quic import ACK_LATE_S, Link, unacked_bytes
from tests.net.linked import linked

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


async def acknowledged(link: Link, within_s: float) -> float:
    """Seconds until the peer acknowledged all `link` sent; TimeoutError past `within_s`."""
    t0 = asyncio.get_running_loop().time()
    async with asyncio.timeout(within_s):
        while unacked_bytes(link.conn):
            await asyncio.sleep(0.001)
    return asyncio.get_running_loop().time() - t0


async def test_every_second_datagram_is_acknowledged_at_once_and_the_other_within_the_late_bound() -> None:
    async with linked() as (_, member, out, inbound):
        inbound.ack_every_second()
        for i in range(6):
            await out.send(b"frame %d" % i)
            assert await inbound.recv(5) == b"frame %d" % i
            if i % 2 == 0:  # the first of a pair: its ACK waits for the next one (or the late timer)
                assert inbound.conn.ack_postponed and unacked_bytes(out.conn) > 0
                assert member.late_acks.armed
            else:  # the second: acknowledged with the first, at once, and no timer left to fire
                assert not inbound.conn.ack_postponed and not member.late_acks.armed
                await acknowledged(out, 1.0)
        await out.send(b"last")  # nothing follows it: the late timer acknowledges it
        assert await inbound.recv(5) == b"last"
        assert inbound.conn.ack_postponed
        waited = await acknowledged(out, 2.0)
        assert waited >= ACK_LATE_S / 2 and not inbound.conn.ack_postponed and not member.late_acks.armed


async def test_a_link_that_acknowledges_at_once_is_unchanged() -> None:
    async with linked() as (_, member, out, inbound):
        for i in range(3):
            await out.send(b"frame %d" % i)
            assert await inbound.recv(5) == b"frame %d" % i
            assert not inbound.conn.ack_postponed and not member.late_acks.armed
            await acknowledged(out, 1.0)

"""EMULATION (`--link-rate`) on a real QUIC link: what a member sends and receives runs at its emulated rate."""

from __future__ import annotations

import asyncio

import pytest

from kafila.net.rate import LinkRate
from tests.net.linked import linked

pytestmark = pytest.mark.fast
MESSAGE = 64 * 1024
MESSAGES = 48  # 3 MiB: about 3 s at 8 Mbit/s


async def _throughput(host_rate: LinkRate | None, member_rate: LinkRate | None) -> tuple[float, float]:
    """(bytes/s of 3 MiB sent host -> member over a QUIC link, the seconds it took), timed at the receiver."""
    async with linked(host_rate=host_rate, member_rate=member_rate) as (_, _, out, into):
        loop = asyncio.get_running_loop()

        async def send() -> None:
            for i in range(MESSAGES):
                await out.send(bytes([i]) * MESSAGE)

        sending = asyncio.create_task(send())
        first = await into.recv(timeout=30)
        t0 = loop.time()
        got = [first]
        for _ in range(MESSAGES - 1):
            got.append(await into.recv(timeout=30))
        over = loop.time() - t0
        await sending
    assert [m[0] for m in got] == list(range(MESSAGES))  # whole and in order despite the emulated drops
    return (MESSAGES - 1) * MESSAGE / over, over


@pytest.mark.parametrize("side", ["host's uplink", "member's downlink"])
async def test_a_link_runs_no_faster_than_the_emulated_rate(side: str) -> None:
    rate = LinkRate.parse("8")  # 1 MB/s
    limited = rate.uplink()
    measured, over = await _throughput(rate if side == "host's uplink" else None,
                                       rate if side == "member's downlink" else None)
    print(f"{side} at {rate.label()}: {measured / 1e6:.3f} MB/s over {over:.1f} s")
    # the bucket never lets more through than burst + rate x time (the receiver's clock may squeeze the
    # window by a few ms); QUIC's congestion control finding the rate through drops keeps it below
    assert measured <= (limited.burst + limited.rate * over) / over * 1.05
    assert measured >= 0.3 * limited.rate  # loose: a busy machine's late timers idle the link a little

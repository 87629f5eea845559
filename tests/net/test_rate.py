"""EMULATION (`--link-rate`): the token bucket's accounting, and its rate measured on real sockets."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.net.rate import MBIT, LinkRate, RateQueue, paced
from kafila.net.udp import UdpSocket

pytestmark = pytest.mark.fast


@given(offers=st.lists(st.tuples(st.floats(0, 0.01), st.integers(1, 1500)), min_size=1, max_size=300),
       rate=st.floats(1e4, 1e7), burst=st.integers(1500, 64_000))
def test_no_interval_lets_through_more_than_burst_plus_rate_times_its_length(
        offers: list[tuple[float, int]], rate: float, burst: int) -> None:
    q, now, out = RateQueue(rate, burst, max_wait_s=0.05), 0.0, []
    for gap, n in offers:
        now += gap
        leave = q.depart(n, now)
        if leave is not None:
            assert now <= leave <= now + 0.05 + 1e-9
            assert not out or leave >= out[-1][0]  # in order
            out.append((leave, n))
    assert q.passed == sum(n for _, n in out) and q.passed + q.dropped == sum(n for _, n in offers)
    for j in range(len(out)):
        total = 0
        for k in range(j, len(out)):
            total += out[k][1]
            assert total <= burst + rate * (out[k][0] - out[j][0]) + 1e-6 * total


def test_a_backlogged_link_runs_at_its_rate() -> None:
    """Offered twice the rate for 10 s: the bytes gone by each second are rate x time (+ the burst), no less."""
    rate, q = 1e6, RateQueue(1e6)
    leaves = [t for i in range(20_000) if (t := q.depart(1000, i * 0.0005)) is not None]
    for second in range(1, 10):
        gone = sum(1000 for t in leaves if t <= second)
        assert rate * second <= gone <= rate * second + q.burst + 1000
    assert q.dropped > 0  # half of what was offered found the queue full


def test_the_flag_parses_and_labels_itself_as_emulated() -> None:
    assert LinkRate.parse("80") == LinkRate(80, 80) and LinkRate.parse("80/160") == LinkRate(80, 160)
    assert LinkRate.parse("80/160").label() == "80 up / 160 down Mbit/s (emulated)"
    assert LinkRate.parse("40").label() == "40 Mbit/s (emulated)"
    assert LinkRate.parse("40").uplink().rate == 40 * MBIT
    for bad in ("0", "-3", "fast", "1/2/3", "80/", "1e9"):
        with pytest.raises(ValueError, match="--link-rate is Mbit/s"):
            LinkRate.parse(bad)


async def _measure(send_rate: RateQueue | None, receive_rate: RateQueue | None, seconds: float) -> tuple[int, float]:
    """Blast 1,200-byte datagrams at ~2.4 MB/s for `seconds` over loopback; (bytes handed over, over how long)."""
    loop = asyncio.get_running_loop()
    arrived: list[tuple[float, int]] = []
    receiver = UdpSocket(loop, ("127.0.0.1", 0), lambda b: arrived.extend((loop.time(), len(d)) for d, _ in b),
                         receive_rate=receive_rate)
    sender = UdpSocket(loop, ("127.0.0.1", 0), lambda b: None, send_rate=send_rate)
    end = loop.time() + seconds
    while loop.time() < end:
        for _ in range(5):
            sender.sendto(b"x" * 1200, receiver.local_addr)
        await asyncio.sleep(0.0025)
    await asyncio.sleep(0.3)  # the queue drains
    sender.close()
    receiver.close()
    first, last = arrived[0][0], arrived[-1][0]
    return sum(n for _, n in arrived[1:]), last - first


@pytest.mark.parametrize("direction", ["send", "receive"])
async def test_the_rate_measured_on_real_sockets(direction: str) -> None:
    """8 Mbit/s (1 MB/s) emulated on a sender's uplink or a receiver's downlink, measured over 2 s."""
    queue = RateQueue(8 * MBIT)
    got, over = await _measure(queue if direction == "send" else None, queue if direction == "receive" else None, 2.0)
    measured = got / over
    print(f"{direction}: {measured / 1e6:.3f} MB/s measured for an emulated 1.000 MB/s ({queue.dropped} bytes dropped)")
    # never faster than the bucket allows (loopback jitter can only squeeze the window by a few ms);
    # the lower bound is loose: a loaded machine's late timers may idle the link a little
    assert measured <= (queue.burst + queue.rate * over) / over * 1.02
    assert measured >= 0.7 * queue.rate
    assert queue.dropped > 0  # offered 2.4 MB/s: the emulated router dropped the excess


async def test_without_a_rate_nothing_is_held_or_dropped() -> None:
    """The emulation is off unless asked for: 300 datagrams sent at once all leave at once and all arrive."""
    loop = asyncio.get_running_loop()
    arrived, all_in = [], asyncio.Event()

    def on_batch(batch: list[tuple[bytes, tuple[str, int]]]) -> None:
        arrived.extend(batch)
        if len(arrived) == 300:
            all_in.set()

    receiver = UdpSocket(loop, ("127.0.0.1", 0), on_batch)
    sender = UdpSocket(loop, ("127.0.0.1", 0), lambda b: None)
    for i in range(300):
        sender.sendto(i.to_bytes(2, "big") * 600, receiver.local_addr)
    assert sender._release is None  # nothing waits for a timer: every datagram went to the kernel at once
    await asyncio.wait_for(all_in.wait(), 10)
    assert [d[:2] for d, _ in arrived] == [i.to_bytes(2, "big") for i in range(300)]
    sender.close()
    receiver.close()


def test_one_machines_endpoints_share_its_connection() -> None:
    """A host's coordinator and its own member get one LinkRate: one uplink and one downlink between them."""
    rate = LinkRate.parse("40/160")
    assert rate.uplink() is rate.uplink() and rate.downlink() is rate.downlink()
    assert rate.uplink() is not rate.downlink() and rate.downlink().rate == 160 * MBIT
    assert LinkRate.parse("40/160") == rate  # the queues are not part of its value


async def test_a_stream_waits_for_the_link_and_shares_it_with_datagrams() -> None:
    """EMULATION: an HTTP download's bytes pass the downlink paced, never dropped, even when a piece of it is more
    than the queue may hold (a slow link) and when datagrams fill the queue first."""
    loop = asyncio.get_running_loop()
    slow = RateQueue(20_000, burst=0)  # 160 kbit/s: 64 kB would wait 3 s, past the queue's 0.1 s
    t0 = loop.time()
    await paced(slow, 10_000)
    assert slow.passed == 10_000 and slow.dropped == 0
    assert loop.time() - t0 >= (10_000 - slow.burst) / slow.rate
    link = RateQueue(1e6, burst=0)
    while link.depart(1200, loop.time()) is not None:  # datagrams fill its 0.1 s queue
        pass
    t0 = loop.time()
    await paced(link, 200_000)
    assert link.dropped == 1200 and link.passed >= 200_000
    assert loop.time() - t0 >= (link.passed - 1200) / link.rate - 0.01  # after the datagrams, at the rate

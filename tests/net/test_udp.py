"""The endpoint's UDP socket reads every waiting datagram in one batch."""

from __future__ import annotations

import asyncio
import socket

import pytest

from kafila.net.udp import MAX_BATCH, UdpSocket

pytestmark = pytest.mark.fast


async def test_datagrams_waiting_together_arrive_as_one_batch() -> None:
    batches: list[list[tuple[bytes, tuple[str, int]]]] = []
    got = asyncio.Event()

    def on_batch(batch: list[tuple[bytes, tuple[str, int]]]) -> None:
        batches.append(batch)
        if sum(len(b) for b in batches) >= 3 + MAX_BATCH:
            got.set()

    us = UdpSocket(asyncio.get_running_loop(), ("127.0.0.1", 0), on_batch)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.bind(("127.0.0.1", 0))
        for i in range(3):  # sent before the loop looks: one wake-up finds all three
            sender.sendto(bytes([i]) * 100, us.local_addr)
        await asyncio.sleep(0.05)
        assert batches == [[(bytes([i]) * 100, sender.getsockname()) for i in range(3)]]
        for i in range(MAX_BATCH):  # a flood is cut into bounded batches, in order
            sender.sendto(i.to_bytes(2, "big"), us.local_addr)
        await asyncio.wait_for(got.wait(), 5)
    flood = [d for b in batches[1:] for d, _ in b]
    assert flood == [i.to_bytes(2, "big") for i in range(MAX_BATCH)]
    assert all(len(b) <= MAX_BATCH for b in batches)
    us.close()
    us.sendto(b"after close", ("127.0.0.1", 9))  # dropped quietly, no error


async def test_an_emulated_link_delay_holds_every_datagram_in_order_and_a_close_drops_the_rest() -> None:
    # EMULATION (--link-delay): each datagram leaves no earlier than `delay` after it was sent, in order
    delay, got, arrived = 0.05, asyncio.Event(), []
    loop = asyncio.get_running_loop()

    def on_batch(batch: list[tuple[bytes, tuple[str, int]]]) -> None:
        arrived.extend((loop.time(), d) for d, _ in batch)
        if len(arrived) >= 20:
            got.set()

    receiver = UdpSocket(loop, ("127.0.0.1", 0), on_batch)
    sender = UdpSocket(loop, ("127.0.0.1", 0), lambda batch: None, delay_s=delay)
    sent = {}
    for i in range(20):
        sent[i.to_bytes(2, "big")] = loop.time()
        sender.sendto(i.to_bytes(2, "big"), receiver.local_addr)
        if i % 5 == 4:
            await asyncio.sleep(0.01)  # several leave together, others later
    assert not arrived, "a datagram left before its delay"
    await asyncio.wait_for(got.wait(), 10)
    assert [d for _, d in arrived] == list(sent)  # in the order sent
    assert all(t - sent[d] >= delay - 1e-3 for t, d in arrived), [(t - sent[d], d) for t, d in arrived]
    sender.sendto(b"held", receiver.local_addr)
    sender.close()  # what it still held goes nowhere, and no timer fires on a closed socket
    await asyncio.sleep(2 * delay)
    assert len(arrived) == 20
    receiver.close()

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

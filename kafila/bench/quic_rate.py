"""aioquic's own one-way rate on one connection over loopback: the yardstick for stage delivery.

A receiver process serves one QUIC connection and counts the bytes of one stream; this process
connects, writes `size` bytes on that stream and stops the clock when the receiver answers that
all arrived. Both ends use Kafila's own QUIC configuration (windows, datagram size) but none of
its framing, pinning or delivery code: what is left is aioquic itself.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic.events import QuicEvent, StreamDataReceived

from kafila.bench.proc_cpu import cpu_s

WRITE = 1 << 20
DONE = b"done"


class _Counter(QuicConnectionProtocol):
    """The receiver: counts stream bytes and answers DONE once `expected` have arrived."""

    expected = 0

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.got = 0

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived):
            self.got += len(event.data)
            if self.got >= self.expected:
                self._quic.send_stream_data(event.stream_id, DONE, end_stream=True)
                self.transmit()


def _receiver(port: int, size: int, datagram: int, ready: Connection) -> None:
    from kafila.net.quic import Identity, configuration

    async def main() -> None:
        config = configuration(Identity("receiver"), is_client=False, idle_timeout_s=60.0)
        config.max_datagram_size = datagram
        _Counter.expected = size
        server = await serve("127.0.0.1", port, configuration=config, create_protocol=_Counter)
        ready.send(True)
        await asyncio.sleep(600)  # ended by the parent
        server.close()

    asyncio.run(main())


class _Sender(QuicConnectionProtocol):
    """The sender: wakes a writer whenever datagrams (acknowledgements) arrive."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.progress = asyncio.Event()

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        super().datagram_received(data, addr)
        self.progress.set()


async def _send(port: int, size: int, datagram: int, receiver_pid: int) -> dict[str, float | None]:
    from kafila.net.quic import SEND_BUFFER_HIGH, Identity, configuration, unacked_bytes

    config = configuration(Identity("sender"), is_client=True, idle_timeout_s=60.0)
    config.max_datagram_size = datagram
    async with connect("127.0.0.1", port, configuration=config, create_protocol=_Sender) as client:
        assert isinstance(client, _Sender)
        reader, writer = await client.create_stream()
        block = b"\x5a" * WRITE
        cpu0 = (cpu_s(), cpu_s(receiver_pid))
        t0 = time.perf_counter()
        left = size
        while left > 0:
            writer.write(block[:min(left, WRITE)])
            left -= WRITE
            # as Kafila's Link does: a bounded send buffer (aioquic slows down on a huge one)
            while unacked_bytes(client._quic) > SEND_BUFFER_HIGH:
                client.progress.clear()
                await client.progress.wait()
        answer = await asyncio.wait_for(reader.read(), timeout=600)
        elapsed = time.perf_counter() - t0
        cpu1 = (cpu_s(), cpu_s(receiver_pid))
    if answer != DONE:
        raise RuntimeError(f"the aioquic receiver answered {answer!r}")
    return {"seconds": elapsed, **cpu_per_mb(size, cpu0, cpu1)}


def cpu_per_mb(size: int, before: tuple[float | None, float | None],
               after: tuple[float | None, float | None]) -> dict[str, float | None]:
    """CPU milliseconds per MB moved, of the sending and the receiving process (None where unknown)."""
    out: dict[str, float | None] = {}
    for key, b, a in zip(("sender_cpu_ms_per_mb", "receiver_cpu_ms_per_mb"), before, after, strict=True):
        out[key] = (a - b) * 1e3 / (size / 1e6) if a is not None and b is not None else None
    return out


def kafila_datagram_size(ip: str = "127.0.0.1", relay: bool = False) -> int:
    """The datagram size Kafila's stage delivery sends toward `ip` (directly, or through the relay) once its
    path MTU search is done.

    The search (kafila.net.pmtu) stops at the largest size the path carries, up to the path's ceiling; on a
    direct path within this machine that is the route's MTU less the IPv4 and UDP headers, which the kernel
    knows, up to aioquic's limit. tests/net/test_pmtu_sockets.py checks that the search does reach it on loopback.
    """
    from kafila.net.pmtu import PmtuSearch
    from kafila.net.udp import route_payload_limit

    search = PmtuSearch()
    limit = None if relay else route_payload_limit((ip, 9))
    if limit is not None:
        search.start(0.0, limit)
    return search.ceiling



def one_way_rate(size: int, datagram: int) -> dict[str, float | None]:
    """Bytes, seconds and MB/s of one `size`-byte stream from this process to a receiver process."""
    from kafila.net.ports import free_udp_pair

    port = free_udp_pair()
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(port, size, datagram, theirs), daemon=True)
    proc.start()
    try:
        if not ours.poll(60):
            raise RuntimeError("the aioquic receiver did not start within 60 s")
        ours.recv()
        assert proc.pid is not None
        sent = asyncio.run(_send(port, size, datagram, proc.pid))
    finally:
        proc.terminate()
        proc.join(10)
    seconds = float(sent["seconds"] or 0.0)
    return {"bytes": size, **sent, "mb_per_s": size / seconds / 1e6, "datagram_bytes": datagram}

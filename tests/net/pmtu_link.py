"""One real QUIC link on loopback until both ends' path MTU searches are done: `python -m tests.net.pmtu_link`.

Run in-process by tests/net/test_pmtu_sockets.py, and as a subprocess inside a network namespace whose
loopback has a smaller MTU; prints its findings as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from kafila.net.endpoint import PeerEndpoint
from kafila.net.pmtu import PmtuState
from kafila.net.quic import Link
from tests.net.linked import linked


async def _searched(ep: PeerEndpoint, link: Link, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while (s := ep.core.mtu_search(link.conn)) is None or s.state is not PmtuState.DONE:
            await asyncio.sleep(0.05)


async def measure(nbytes: int, timeout_s: float = 60.0, allow_direct: bool = True) -> dict[str, Any]:
    """Open a link, send `nbytes` each way, wait for both searches; both ends' datagram sizes and the path."""
    async with linked(allow_direct) as (a, b, link, incoming):
        await a.settle_path(a.peers[b.member_id])
        payload = bytes(range(256)) * (nbytes // 256)
        await link.send(payload)
        got = await incoming.recv(timeout_s)
        await incoming.send(got[::-1])
        back = await link.recv(timeout_s)
        await asyncio.gather(_searched(a, link, timeout_s), _searched(b, incoming, timeout_s))
        # and data at the found size: a size the path did not carry would stall this
        await link.send(payload)
        again = await incoming.recv(timeout_s)
        return {"host": link.conn.datagram_size, "member": incoming.conn.datagram_size, "path": link.path,
                "intact": got == payload and back == payload[::-1] and again == payload}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20))))

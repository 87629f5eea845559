"""A stage moving over a link: the host's sender and the member's receiving loop.

Neither side ever holds more than a few chunks: the sender reads one chunk from disk at a time and
`Link.send` waits while more than SEND_BUFFER_HIGH bytes are unacknowledged; the receiver verifies
and writes each chunk to its `.part` file as it arrives (delivery.StageReceiver). The host runs one
sender per member at once, so several members are fed concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from kafila.net.quic import Link
from kafila.session.delivery.stage_files import StageReceiver, read_chunk
from kafila.session.protocol import messages
from kafila.session.protocol.chunks import CHUNK_MAGIC, chunk, parse_chunk
from kafila.session.protocol.manifest import StageManifest
from kafila.session.stoppable import run_stoppable


class Superseded(Exception):
    """The host gave this epoch up (a newer plan, a loss, the end) while this stage was arriving: the transfer
    is abandoned (its `.part` stays, so a later assignment of the same stage resumes it)."""


async def send_stage(link: Link, path: Path, manifest: StageManifest, chunks: Sequence[int],
                     progress: Callable[[int], None] | None = None, magic: bytes = CHUNK_MAGIC) -> int:
    """Send the chunks a member asked for; returns the stage bytes sent (`progress` gets each chunk's size).
    `magic`: COPY_MAGIC for a model copy's chunks."""
    sent = 0
    for i in chunks:
        data = await asyncio.to_thread(read_chunk, path, manifest, i)
        await link.send(chunk(i, data, magic))
        sent += len(data)
        if progress is not None:
            progress(len(data))
    return sent


async def receive_stage(link: Link, receiver: StageReceiver, timeout_s: float,
                        aside: Callable[[bytes], None], progress: Callable[[int], None] | None = None) -> Path:
    """Chunks from `link` into `receiver` until the stage is whole and verified; other messages go to `aside`.

    Call receiver.missing() (and ask the sender for those chunks) first.
    """
    while not receiver.complete:
        raw = await link.recv(timeout=timeout_s)
        if messages.kind(raw) != "chunk":
            aside(raw)
            continue
        index, data = parse_chunk(raw)
        # on the loop, not a worker thread: while a chunk is hashed and written no more datagrams are read,
        # so messages cannot pile up in the link's inbox faster than they are stored (memory stays bounded)
        receiver.accept(index, data)
        if progress is not None:
            progress(len(receiver.have))
    return await run_stoppable(receiver.finish)

"""Chunks of a file sent over a link: a stage's (host → member) or the model's own (a copy: host → heir).

    magic (4 bytes) | u32 index, little-endian | the chunk's raw bytes

Each chunk is verified against its manifest's sha256 by the receiver (delivery.stage_files.StageReceiver);
the magic keeps a model copy's chunks from being taken for a stage's while both share a control link.
"""

from __future__ import annotations

import struct

from kafila.errors import ProtocolError

CHUNK_MAGIC = b"KFC1"
COPY_MAGIC = b"KFM1"
COPY_BATCH = 8  # model-copy chunks a member asks for at once

_CHUNK = struct.Struct("<4sI")


def chunk(index: int, data: bytes, magic: bytes = CHUNK_MAGIC) -> bytes:
    """Encode one stage-file chunk (or, with COPY_MAGIC, one chunk of a model copy)."""
    return _CHUNK.pack(magic, index) + data


def parse_chunk(msg: bytes, magic: bytes = CHUNK_MAGIC) -> tuple[int, bytes]:
    """Decode a stage-file chunk (or a model copy's) into (index, bytes)."""
    what = "stage" if magic == CHUNK_MAGIC else "model-copy"
    if len(msg) < _CHUNK.size:
        raise ProtocolError(f"{what} chunk shorter than its header")
    got, index = _CHUNK.unpack_from(msg)
    if got != magic:
        raise ProtocolError(f"not a {what} chunk")
    return index, msg[_CHUNK.size :]

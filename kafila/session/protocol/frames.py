"""Activation frames: the message one stage sends the next (a header plus raw float32 rows).

The one codec for them: the head encodes the first frame of a batch, every stage decodes what it
receives and encodes what it passes on (`Frame.passed`), the head decodes it when it comes back.

Layout (little-endian, because the rows are little-endian float32 straight from llama.cpp):

    offset  size        field
    0       4           magic b"KFA1"
    4       1           version (3)
    5       1           phase: 0 prefill, 1 decode
    6       1           dtype: 0 float32 (the only one for now)
    7       1           n_times: number of per-stage compute times that follow the positions
    8       8           u64 frame id (the head matches a returning frame to what it sent)
    16      4           u32 rows
    20      4           u32 width (n_embd)
    24      4*rows      u32 position of each row
    ...     2*rows      u16 KV-cache sequence of each row (rows of several requests share a frame)
    ...     rows        u8 step of each row: 0, or a drafted token's place in its verification (each step
                        is computed in calls of its own, after the step before: engine/ubatch.py)
    ...     8*n_times   u64 compute time of each stage so far, nanoseconds (appended hop by hop)
    ...     4*rows*width  float32 rows, row-major

decode() checks every size against the bytes present and raises ProtocolError otherwise.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from kafila.errors import ProtocolError

MAGIC = b"KFA1"
VERSION = 3
MAX_ROWS = 1 << 16
MAX_WIDTH = 1 << 16
MAX_TIMES = 64
_FIXED = struct.Struct("<4sBBBBQII")


class Phase(IntEnum):
    """Which kind of forward pass the rows belong to."""

    PREFILL = 0
    DECODE = 1


DTYPES: dict[int, np.dtype] = {0: np.dtype("<f4")}


@dataclass(frozen=True)
class ActivationHeader:
    """Everything about an activation frame except the rows themselves."""

    frame_id: int
    phase: Phase
    positions: tuple[int, ...]
    rows: int
    width: int
    dtype: int = 0
    stage_times_ns: tuple[int, ...] = ()
    seqs: tuple[int, ...] = ()  # one per row
    steps: tuple[int, ...] = ()  # one per row; () when every row is step 0 (no drafted rows)

    @property
    def payload_bytes(self) -> int:
        """Size of the rows in bytes."""
        return self.rows * self.width * DTYPES[self.dtype].itemsize


@dataclass(frozen=True, eq=False)  # eq on arrays is ambiguous: compare header and rows separately
class Frame:
    """A header and its rows (shape rows x width)."""

    header: ActivationHeader
    rows: np.ndarray

    def passed(self, rows: np.ndarray, time_ns: int) -> Frame:
        """The next stage's frame: this stage's output rows, its compute time appended."""
        h = self.header
        out = ActivationHeader(h.frame_id, h.phase, h.positions, rows.shape[0], rows.shape[1], h.dtype,
                               (*h.stage_times_ns, time_ns), h.seqs, h.steps)
        return Frame(out, rows)


def encode(frame: Frame) -> bytes:
    """Serialise a frame; ValueError when the header and the rows disagree (a bug, not bad input)."""
    header, rows = frame.header, frame.rows
    if header.dtype not in DTYPES:
        raise ValueError(f"unsupported dtype code {header.dtype}")
    if len(header.positions) != header.rows or len(header.seqs) != header.rows:
        raise ValueError("one position and one sequence per row are required")
    steps = header.steps or (0,) * header.rows
    if len(steps) != header.rows:
        raise ValueError("one step per row (or none) is required")
    in_bounds = 0 <= header.rows <= MAX_ROWS and 0 <= header.width <= MAX_WIDTH
    if not in_bounds or len(header.stage_times_ns) > MAX_TIMES:
        raise ValueError("frame shape out of bounds")
    if rows.shape != (header.rows, header.width):
        raise ValueError(f"rows have shape {rows.shape}, header says {(header.rows, header.width)}")
    payload = np.ascontiguousarray(rows, dtype=DTYPES[header.dtype]).tobytes()
    head = _FIXED.pack(MAGIC, VERSION, int(header.phase), header.dtype, len(header.stage_times_ns),
                       header.frame_id, header.rows, header.width)
    return b"".join([
        head,
        struct.pack(f"<{header.rows}I", *header.positions),
        struct.pack(f"<{header.rows}H", *header.seqs),
        bytes(steps),
        struct.pack(f"<{len(header.stage_times_ns)}Q", *header.stage_times_ns),
        payload,
    ])


def decode(buf: bytes | memoryview) -> Frame:
    """Parse a frame; its rows are a view of `buf` (no copy)."""
    mv = memoryview(buf)
    if len(mv) < _FIXED.size:
        raise ProtocolError(f"activation frame of {len(mv)} bytes is shorter than its {_FIXED.size}-byte header")
    magic, version, phase, dtype, n_times, frame_id, rows, width = _FIXED.unpack_from(mv)
    if magic != MAGIC:
        raise ProtocolError("not an activation frame (bad magic)")
    if version != VERSION:
        raise ProtocolError(f"activation frame version {version} is not supported (this build speaks {VERSION})")
    if phase not in (0, 1):
        raise ProtocolError(f"unknown phase {phase}")
    if dtype not in DTYPES:
        raise ProtocolError(f"unknown dtype code {dtype}")
    if rows > MAX_ROWS or width > MAX_WIDTH or n_times > MAX_TIMES:
        raise ProtocolError(f"activation shape {rows}x{width} (or {n_times} stage times) out of bounds")
    o = _FIXED.size
    need = o + 7 * rows + 8 * n_times + rows * width * DTYPES[dtype].itemsize
    if len(mv) != need:
        raise ProtocolError(f"activation frame is {len(mv)} bytes, its header says {need}")
    positions = struct.unpack_from(f"<{rows}I", mv, o)
    o += 4 * rows
    seqs = struct.unpack_from(f"<{rows}H", mv, o)
    o += 2 * rows
    steps = tuple(mv[o : o + rows]) if any(mv[o : o + rows]) else ()
    o += rows
    times = struct.unpack_from(f"<{n_times}Q", mv, o)
    o += 8 * n_times
    header = ActivationHeader(frame_id, Phase(phase), tuple(positions), rows, width, dtype, tuple(times),
                              tuple(seqs), steps)
    return Frame(header, np.frombuffer(mv[o:], dtype=DTYPES[dtype]).reshape(rows, width))

"""What a stage checks in a neighbour's activation frame before llama.cpp sees it (issue 55, finding 2).

llama.cpp trusts its input. A frame of more rows than the context's `n_batch`, or rows of another width, made
the call fail in the *receiving* stage, which then reported itself lost and left; a position it already holds,
a jump, or -1 it took and computed from a KV cache that no longer matched the request; NaN rows spread into
every later token. Each of these is the sender's fault, so a stage checks them here first and raises
NeighbourFault saying what was wrong: serving.py reports the sender to the coordinator, never itself.

Positions: a sequence's rows in a frame continue exactly where its KV cache on this stage ends (`Cursors`,
kept from the frames that passed and the `free`/`trim` messages, which travel in order with the frames), one
after another, inside the context. Every stage computes the head's batches in the head's order, so an honest
ring always meets this (head.py); llama.cpp itself checks the same only loosely for embedding input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from kafila.engine.stage import ContextConfig
from kafila.errors import NeighbourFault, ProtocolError
from kafila.session.protocol.frames import Frame

T = TypeVar("T")

@dataclass(frozen=True)
class FrameLimits:
    """The shape every frame of this ring has: at most `n_batch` rows of `width` floats, positions below `n_ctx`."""

    n_batch: int
    width: int
    n_ctx: int  # per sequence
    slots: int  # sequence ids are 0..slots-1

    @classmethod
    def of(cls, config: ContextConfig, width: int) -> FrameLimits:
        return cls(config.n_batch, width, config.n_ctx_per_seq, config.n_seq_max)


def shape_fault(frame: Frame, limits: FrameLimits) -> str | None:
    """What is wrong with a frame's shape, sequences or values (None: nothing); positions aside."""
    h = frame.header
    if not 0 < h.rows <= limits.n_batch:
        return f"frame {h.frame_id} has {h.rows} rows; a call carries 1 to {limits.n_batch} (n_batch)"
    if h.width != limits.width:
        return f"frame {h.frame_id} has rows of width {h.width}; the model's is {limits.width}"
    bad = [s for s in h.seqs if not 0 <= s < limits.slots]
    if bad:  # llama.cpp aborts the process on some calls with a sequence past its slots
        return f"sequence {bad[0]} is outside the admitted {limits.slots} slots"
    if not np.isfinite(frame.rows).all():
        row = int(np.flatnonzero(~np.isfinite(frame.rows).all(axis=1))[0])
        return f"frame {h.frame_id} has a value that is not finite (NaN or infinity) in row {row}"
    return None


def position_fault(frame: Frame, limits: FrameLimits, next_pos: dict[int, int]) -> str | None:
    """What is wrong with a frame's positions, given where each sequence's KV cache ends (None: nothing)."""
    h = frame.header
    expect = dict(next_pos)
    for seq, pos in zip(h.seqs, h.positions, strict=True):
        want = expect.get(seq, 0)
        if pos >= limits.n_ctx:  # -1 on the wire is 2**32 - 1: past the context too
            return f"frame {h.frame_id} has sequence {seq} at position {pos}, past the context of {limits.n_ctx}"
        if pos != want:
            held = f"its cache ends at {want}" if want else "its cache is empty"
            return (f"frame {h.frame_id} has sequence {seq} at position {pos}, but {held} "
                    f"(positions must continue one by one)")
        expect[seq] = pos + 1
    return None


@dataclass
class Cursors:
    """Where each sequence's KV cache ends on this stage; `frame` checks a frame and moves them past it."""

    limits: FrameLimits
    next: dict[int, int] = field(default_factory=dict)  # seq -> its next position (absent: 0)

    def frame(self, frame: Frame) -> None:
        """NeighbourFault unless `frame` is one an honest ring sends now; then its rows count as cached."""
        why = shape_fault(frame, self.limits) or position_fault(frame, self.limits, self.next)
        if why is not None:
            raise NeighbourFault(why)
        for seq, pos in zip(frame.header.seqs, frame.header.positions, strict=True):
            self.next[seq] = pos + 1

    def drop(self, seq: int, keep: int = 0) -> None:
        """A `free` (keep 0) or `trim` of `seq` passed: its positions from `keep` on are gone."""
        self._admitted(seq)
        self.next[seq] = min(self.next.get(seq, 0), keep)

    def fork(self, src: int, seq: int, keep: int) -> None:
        """A `fork` passed: `seq` now holds `src`'s positions before `keep`."""
        self._admitted(src)
        self._admitted(seq)
        self.next[seq] = min(self.next.get(src, 0), max(keep, 0))

    def _admitted(self, seq: int) -> None:
        if not 0 <= seq < self.limits.slots:
            raise NeighbourFault(f"sequence {seq} is outside the admitted {self.limits.slots} slots")


def from_neighbour(decode: Callable[[bytes], T], raw: bytes) -> T:
    """`decode(raw)` of what a ring neighbour sent; bytes that do not parse are its fault (NeighbourFault)."""
    try:
        return decode(raw)
    except NeighbourFault:
        raise
    except ProtocolError as exc:
        raise NeighbourFault(str(exc)) from None

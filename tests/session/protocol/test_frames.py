"""Activation frames: the round trip, a stage's hand-on, and fuzzing (a frame that reads as the layout says, or a
ProtocolError)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError
from kafila.session.protocol import frames
from kafila.session.protocol.frames import ActivationHeader, Frame, Phase
from tests.fuzzing import refused_or_checked

pytestmark = pytest.mark.fast

FUZZ = settings(max_examples=500, deadline=None)


def test_activation_round_trip() -> None:
    rows = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    h = ActivationHeader(7, Phase.DECODE, (10, 11, 12), 3, 5, 0, (1000, 2000), (0, 3, 1))
    buf = frames.encode(Frame(h, rows))
    back = frames.decode(buf)
    assert back.header == h
    assert np.array_equal(back.rows, rows)
    with pytest.raises(ProtocolError, match="header says"):
        frames.decode(buf[:-1])


def test_a_stage_passes_its_rows_on_with_its_time_appended() -> None:
    h = ActivationHeader(9, Phase.PREFILL, (0, 1), 2, 4, seqs=(1, 1), stage_times_ns=(5,))
    out = np.ones((2, 3), np.float32)
    nxt = frames.decode(frames.encode(Frame(h, np.zeros((2, 4), np.float32)).passed(out, 77)))
    assert nxt.header == ActivationHeader(9, Phase.PREFILL, (0, 1), 2, 3, seqs=(1, 1), stage_times_ns=(5, 77))
    assert np.array_equal(nxt.rows, out)


@given(st.integers(0, 2**64 - 1), st.sampled_from(list(Phase)), st.integers(0, 6), st.integers(0, 5),
       st.lists(st.integers(0, 2**64 - 1), max_size=5), st.data())
def test_round_trip_property(fid: int, phase: Phase, n: int, width: int, times: list[int], data: st.DataObject) -> None:
    pos = tuple(data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n)))
    seqs = tuple(data.draw(st.lists(st.integers(0, 0xFFFF), min_size=n, max_size=n)))
    steps = tuple(data.draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)))
    steps = steps if any(steps) else ()  # the header's way of saying every row is step 0
    rows = np.arange(n * width, dtype=np.float32).reshape(n, width)
    h = ActivationHeader(fid, phase, pos, n, width, 0, tuple(times), seqs, steps)
    back = frames.decode(frames.encode(Frame(h, rows)))
    assert back.header == h and np.array_equal(back.rows, rows)


def check_accepted(buf: bytes, frame: Frame) -> None:
    """A frame decode() accepted: within the documented bounds, every field where the layout in the module's
    docstring puts it (read here by hand, little-endian), and it encodes to the very bytes it came from."""
    h = frame.header
    assert buf[:5] == b"KFA1\x03" and buf[5] == int(h.phase) in (0, 1) and buf[6] == h.dtype == 0
    rows, width, n_times = (int.from_bytes(buf[o:o + n], "little") for o, n in ((16, 4), (20, 4), (7, 1)))
    assert (h.rows, h.width, len(h.stage_times_ns)) == (rows, width, n_times)
    assert rows <= 1 << 16 and width <= 1 << 16 and n_times <= 64
    assert h.frame_id == int.from_bytes(buf[8:16], "little")
    o = 24
    assert h.positions == tuple(int.from_bytes(buf[o + 4 * i:o + 4 * i + 4], "little") for i in range(rows))
    o += 4 * rows
    assert h.seqs == tuple(int.from_bytes(buf[o + 2 * i:o + 2 * i + 2], "little") for i in range(rows))
    o += 2 * rows
    steps = tuple(buf[o:o + rows])
    assert h.steps == (steps if any(steps) else ())  # () stands for every row at step 0
    o += rows
    assert h.stage_times_ns == tuple(int.from_bytes(buf[o + 8 * i:o + 8 * i + 8], "little") for i in range(n_times))
    o += 8 * n_times
    assert len(buf) == o + 4 * rows * width and frame.rows.shape == (rows, width)
    assert frame.rows.tobytes() == buf[o:]
    assert frames.encode(frame) == buf


@FUZZ
@given(st.one_of(st.binary(max_size=400), st.binary(max_size=400).map(lambda b: b"KFA1\x03" + b)))
def test_fuzz_activation(data: bytes) -> None:
    refused_or_checked(data, frames.decode, check_accepted)


@FUZZ
@given(st.integers(0, 8), st.integers(0, 8), st.integers(0, 70), st.integers(0, 2), st.integers(0, 1),
       st.sampled_from([0, 0, 0, -1, 1, 4]), st.data())
def test_fuzz_activation_with_valid_prefix(rows: int, width: int, n_times: int, phase: int, dtype: int, off: int,
                                           data: st.DataObject) -> None:
    """Frames whose header is whole but whose phase, dtype, stage count or size may be wrong: one is accepted
    exactly when all four are right, and then reads as the layout says."""
    head = frames._FIXED.pack(frames.MAGIC, frames.VERSION, phase, dtype, n_times, 1, rows, width)
    need = 7 * rows + 8 * n_times + 4 * rows * width
    size = max(need + off, 0)
    buf = head + data.draw(st.binary(min_size=size, max_size=size))
    right = phase in (0, 1) and dtype == 0 and n_times <= 64 and size == need
    if not right:
        with pytest.raises(ProtocolError):
            frames.decode(buf)
        return
    check_accepted(buf, frames.decode(buf))

"""Activation frames: the round trip, a stage's hand-on, and fuzzing (a frame or a ProtocolError)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError
from kafila.session.protocol import frames
from kafila.session.protocol.frames import ActivationHeader, Frame, Phase

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
    rows = np.arange(n * width, dtype=np.float32).reshape(n, width)
    h = ActivationHeader(fid, phase, pos, n, width, 0, tuple(times), seqs)
    back = frames.decode(frames.encode(Frame(h, rows)))
    assert back.header == h and np.array_equal(back.rows, rows)


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_activation(data: bytes) -> None:
    try:
        frames.decode(data)
    except ProtocolError:
        pass


@FUZZ
@given(st.integers(0, 300), st.integers(0, 300), st.integers(0, 70), st.binary(max_size=300))
def test_fuzz_activation_with_valid_prefix(rows: int, width: int, n_times: int, rest: bytes) -> None:
    head = frames._FIXED.pack(frames.MAGIC, frames.VERSION, 0, 0, n_times, 1, rows, width)
    try:
        frames.decode(head + rest)
    except ProtocolError:
        pass

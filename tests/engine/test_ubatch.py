"""How a stage call's rows are cut into llama.cpp calls: every row once, each call one ubatch llama.cpp keeps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.engine.ubatch import in_batch_order, ubatches

pytestmark = pytest.mark.fast


@given(st.lists(st.integers(0, 7), min_size=1, max_size=80))
def test_every_row_once_in_calls_llama_cpp_keeps_whole(seq: list[int]) -> None:
    seqs = np.array(seq, np.int32)
    calls = ubatches(seqs)
    assert sorted(np.concatenate(calls).tolist()) == list(range(len(seq)))
    for idx in calls:
        assert len(idx) > 0
        ids, counts = np.unique(seqs[idx], return_counts=True)
        # llama.cpp's "equal" split keeps a call whole and in order only when its sequence ids are
        # consecutive, ascending, with the same number of rows each
        assert np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids)))
        assert np.array_equal(seqs[idx], np.repeat(ids, counts)) and len(set(counts.tolist())) == 1
    for s in set(seq):  # a sequence's rows (a request's chunk) in one call, whole and in batch order
        (call,) = [idx for idx in calls if s in seqs[idx]]
        assert np.array_equal(call[seqs[call] == s], np.flatnonzero(seqs == s))


def test_decode_rows_of_consecutive_slots_share_one_call() -> None:
    # one weight read for every decoding request: the case that sets a ring's aggregate speed
    assert [c.tolist() for c in ubatches(np.array([2, 0, 1, 3]))] == [[1, 2, 0, 3]]
    # a prefill chunk beside a decode row is not cut in two: its numbers would change with the frame
    assert [c.tolist() for c in ubatches(np.array([0, 1, 1, 1, 2]))] == [[0], [1, 2, 3], [4]]
    assert [c.tolist() for c in ubatches(np.array([0, 0, 1, 1, 3, 3]))] == [[0, 1, 2, 3], [4, 5]]


@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.data())
def test_outputs_go_back_in_batch_order(seq: list[int], data: st.DataObject) -> None:
    seqs = np.array(seq)
    want = np.array(data.draw(st.lists(st.booleans(), min_size=len(seq), max_size=len(seq))))
    calls = ubatches(seqs)
    # each row's output is its own batch index, so the result must read 0.. in the wanted rows' order
    parts = [idx[want[idx]].astype(np.float32).reshape(-1, 1) for idx in calls]
    out = in_batch_order(calls, want, parts)
    assert out[:, 0].tolist() == np.flatnonzero(want).tolist()


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), min_size=1, max_size=40))
def test_each_step_is_computed_after_the_one_before_in_calls_of_its_own(rows: list[tuple[int, int]]) -> None:
    seqs, steps = np.array([s for s, _ in rows]), np.array([t for _, t in rows])
    calls = ubatches(seqs, steps)
    assert sorted(np.concatenate(calls).tolist()) == list(range(len(rows)))
    order = [int(steps[c[0]]) for c in calls]
    assert all(len(set(steps[c].tolist())) == 1 for c in calls)  # no call mixes steps
    assert order == sorted(order)  # a drafted row's call after the calls of the rows before it
    within = [np.flatnonzero(steps == s)[c] for s in sorted(set(steps.tolist())) for c in ubatches(seqs[steps == s])]
    assert [c.tolist() for c in calls] == [c.tolist() for c in within]  # within a step, as without steps


def test_a_verification_beside_decode_rows() -> None:
    # slot 1 verifies two drafted tokens beside slots 0 and 2's decode rows: step 0 is one call of three
    # rows, then one row a call
    seqs, steps = np.array([0, 1, 1, 1, 2]), np.array([0, 0, 1, 2, 0])
    assert [c.tolist() for c in ubatches(seqs, steps)] == [[0, 1, 4], [2], [3]]

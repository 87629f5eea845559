"""How a stage call's rows are cut into the llama.cpp calls that compute them, one ubatch each.

The stages keep one KV stream per sequence (`kv_unified` off): a request's numbers then depend only on
its own rows, not on its slot or on what other slots hold (DESIGN §2d). With several streams llama.cpp
computes a batch in "equal" ubatches only: consecutive sequence ids, ascending, the same number of rows
of each. Any other batch it would reorder and cut itself, and a body stage, which reads its output
rows from the graph, could not tell whose row is whose; a request's chunk cut in two would also get
other numbers than whole. So a stage cuts its rows into such calls itself; llama.cpp then keeps each
call whole and in order.

A drafted token's row (speculation, `step` > 0) is a call of its own, after the rows of the step before:
rows of one sequence in one call are not those rows computed one per call (DESIGN §5b), so verifying k
drafted tokens in one call would not be greedy-exact; one call per step keeps every row's numbers those
of a plain decode step, while the k+1 rows still cross the network once.
"""

from __future__ import annotations

import numpy as np


def ubatches(seq: np.ndarray, step: np.ndarray | None = None) -> list[np.ndarray]:
    """Batch indices of each call, in the order they run: step 0's calls, then step 1's, ...

    Within a step, a sequence's rows (one request's chunk) always go into one call, whole and in order, so
    its numbers do not depend on what shares the frame: calls join only consecutive sequences with as many
    rows each (the decode rows of consecutive slots, one row each, share one call and one weight read).
    """
    seq = np.asarray(seq)
    if step is None or not np.any(step):
        return _calls(seq, np.arange(len(seq)))
    return [c for s in np.unique(step) for c in _calls(seq, np.flatnonzero(step == s))]


def _calls(seq: np.ndarray, index: np.ndarray) -> list[np.ndarray]:
    """The calls of one step's rows (`index` into the batch)."""
    rows: dict[int, list[int]] = {}
    for i, s in zip(index.tolist(), seq[index].tolist(), strict=True):
        rows.setdefault(s, []).append(i)
    calls: list[list[int]] = []
    last: tuple[int, int] | None = None  # the previous sequence and its row count
    for s in sorted(rows):
        n = len(rows[s])
        if last != (s - 1, n):
            calls.append([])
        calls[-1] += rows[s]
        last = (s, n)
    return [np.array(c, np.intp) for c in calls]


def in_batch_order(calls: list[np.ndarray], want: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    """The output rows of every call (one per wanted row of it, in call order) put back in batch order."""
    if len(calls) == 1 and np.array_equal(calls[0], np.arange(len(want))):
        return parts[0]
    rank = np.cumsum(want) - 1  # a wanted row's place among the batch's outputs
    out = np.empty((int(want.sum()), parts[0].shape[1]), parts[0].dtype)
    for idx, part in zip(calls, parts, strict=True):
        out[rank[idx[want[idx]]]] = part
    return out

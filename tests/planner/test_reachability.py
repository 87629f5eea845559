"""Pair prediction and the all-direct counting rule, checked against exhaustive search."""

from __future__ import annotations

from itertools import combinations_with_replacement

import pytest

from kafila.planner.reachability import DIRECT, RELAY, NatClass, all_direct_ring_exists, predict_all, predict_edge
from tests.planner.brute import all_direct_exists

pytestmark = pytest.mark.fast

P, OR, R, U = NatClass.PERMISSIVE, NatClass.ORDINARY, NatClass.RESTRICTIVE, NatClass.UNKNOWN


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (P, P, DIRECT),
        (P, OR, DIRECT),
        (P, R, DIRECT),
        (OR, OR, DIRECT),
        (OR, R, RELAY),
        (R, R, RELAY),
        (U, P, RELAY),
        (U, OR, RELAY),
        (U, R, RELAY),
        (U, U, RELAY),
    ],
)
def test_pair_table_is_symmetric_and_as_designed(a: NatClass, b: NatClass, expected: str) -> None:
    assert predict_edge(a, b) == expected
    assert predict_edge(b, a) == expected


def test_predict_edge_accepts_plain_strings() -> None:
    assert predict_edge("permissive", "restrictive") == DIRECT  # type: ignore[arg-type]


def test_predict_all_covers_every_pair_once() -> None:
    pairs = predict_all({"a": P, "b": R, "c": OR})
    assert pairs == {("a", "b"): DIRECT, ("a", "c"): DIRECT, ("b", "c"): RELAY}


@pytest.mark.parametrize("m", range(0, 8))
def test_counting_rule_equals_exhaustive_search(m: int) -> None:
    for classes in combinations_with_replacement(list(NatClass), m):
        assert all_direct_ring_exists(classes) == all_direct_exists(list(classes)), classes


def test_unknown_is_not_counted_as_restrictive() -> None:
    # Two permissive members could carry one restrictive member, but never an unknown one.
    assert all_direct_ring_exists([P, P, R])
    assert not all_direct_ring_exists([P, P, U])
    assert all_direct_ring_exists([U])  # one member: no edges at all

"""Who takes coordination over when the coordinator is lost with its own ring member: every member's choice alike."""

from __future__ import annotations

import itertools

import pytest

from kafila.session.member.takeover import successor, survivors
from kafila.session.protocol.messages import Measured, Roster

pytestmark = pytest.mark.fast

MEASURED = Measured(1e9, 0.001, 1 << 30, 1e9, "open", None)


def roster(beside: str | None, holders: tuple[str, ...], names: tuple[str, ...]) -> Roster:
    return Roster("host", "m", dict.fromkeys(names, MEASURED), beside, holders)


def test_the_first_holder_in_ring_order_other_than_the_lost_one_takes_over() -> None:
    order = ("ada", "hal", "bo", "cy")
    assert successor(roster("hal", ("cy", "bo"), order), order) == "bo"
    assert successor(roster("hal", ("hal", "cy"), order), order) == "cy"  # the lost one holds it, but is gone
    assert survivors(roster("hal", (), order), order) == ["ada", "bo", "cy"]


def test_no_survivor_holding_the_model_means_no_successor() -> None:
    order = ("ada", "hal", "bo")
    assert successor(roster("hal", (), order), order) is None
    assert successor(roster("hal", ("hal",), order), order) is None


def test_brute_force_every_member_order_and_holder_set_agrees_with_the_definition() -> None:
    names = ("ada", "bo", "cy", "hal")
    for order in itertools.permutations(names):
        for k in range(len(names) + 1):
            for holders in itertools.combinations(names, k):
                got = successor(roster("hal", holders, names), order)
                holding = [n for n in order if n in holders and n != "hal"]
                assert got == (holding[0] if holding else None)
                # the choice needs only what every member holds alike: the same roster and order
                assert successor(roster("hal", tuple(reversed(holders)), names), order) == got


def test_brute_force_every_order_holder_set_and_lost_set_with_a_coordinate_only_host() -> None:
    """A coordinate-only host (beside None) held no stage; the lost are excluded like the coordinator's own member."""
    names = ("ada", "bo", "cy", "di")
    subsets = [s for k in range(len(names) + 1) for s in itertools.combinations(names, k)]
    for order in itertools.permutations(names):
        for holders in subsets:
            for lost in subsets:
                for beside in (None, *names):
                    r = roster(beside, holders, names)
                    gone = set(lost) | {beside}
                    left = [n for n in order if n not in gone]
                    assert survivors(r, order, lost) == left
                    holding = [n for n in left if n in holders]
                    got = successor(r, order, lost)
                    assert got == (holding[0] if holding else None), (order, holders, lost, beside)
                    # alike on every member: the order the lost were noticed in does not matter
                    assert successor(r, order, tuple(reversed(lost))) == got
    # with nobody lost and a coordinate-only host, the first holder in ring order, wherever it sits
    assert successor(roster(None, ("cy",), names), ("cy", "ada", "bo")) == "cy"
    assert successor(roster(None, ("cy", "bo"), names), ("ada", "bo", "cy"), ("bo",)) == "cy"

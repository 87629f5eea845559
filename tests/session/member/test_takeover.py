"""Who takes coordination over when the coordinator is lost with its own ring member: every member's choice alike."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kafila.session.member.takeover import coordinator_options, successor, survivors
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.protocol.manifest import StageManifest
from kafila.session.protocol.messages import Measured, Roster
from kafila.session.settings import SessionSettings

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


def test_the_successor_coordinates_with_the_sessions_settings_unchanged() -> None:
    """issue 55 item 2: `kafila host --speculate off --no-copy --no-replan --stall-limit 7.5 ...` keeps all of them
    once a member has taken coordination over (before, coordinator_options rebuilt HostOptions field by field and
    left out speculate, replan, copy and stall_s: the ring ran with the defaults)."""
    given = SessionSettings(context=96, concurrency=3, batch=48, speculate="off", replan=False, copy=False,
                            stall_s=7.5, measure_wait_s=33.0, mixed_builds=True, strategy="uniform",
                            chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
                            sources=("https://huggingface.co/o/m/resolve/main/m.gguf",))
    assert given != SessionSettings()  # every field away from its default
    assert all(getattr(given, f) != getattr(SessionSettings(), f) for f in given.as_dict())
    order = ("hal", "ada", "bo")
    sent = messages.Assign(epoch=3, order=order, head="hal", ranges={"hal": (0, 10), "ada": (10, 20), "bo": (20, 30)},
                           settings=given, plan={}, model="m", stage=StageManifest("0" * 64, 1, 1 << 20, ("0" * 64,)),
                           fingerprints={n: "e" * 64 for n in order})
    kept = messages.decode(messages.encode(sent))  # as every member holds it: the last assignment it was sent
    assert isinstance(kept, messages.Assign) and kept.settings == given
    r = roster("hal", ("ada",), order)
    heir = successor(r, order)
    assert heir == "ada"
    opts = coordinator_options(MemberOptions(code="kf-1", name=heir, cache_dir=Path("cache")), Path("model.gguf"),
                               kept, r, len(survivors(r, order)))
    assert opts.settings is kept.settings  # used as it came, not rebuilt
    assert opts.coordinate_only and opts.name == "ada" and opts.api_port is None  # how this process runs

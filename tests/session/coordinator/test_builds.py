"""The host's verdict on a member's build: exact, mixed only by consent, and the wire protocol in every mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.engine.build import BuildIdentity, build_tag
from kafila.session.coordinator.builds import RingBuilds, build_differences, judge_member
from kafila.session.protocol.announcement import wire_protocol

pytestmark = pytest.mark.fast

HOST = build_tag(BuildIdentity("0.3.36", "aaaaaaaaaaaaaaaa", "CPU : SSE3 = 1 | AVX2 = 1"))
NATIVE = build_tag(BuildIdentity("0.3.36", "bbbbbbbbbbbbbbbb", "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1"))


def announced(build: str, proto: str | None = None) -> dict[str, object]:
    d: dict[str, object] = {"build": build, "bw": 1e9}
    d["proto"] = wire_protocol() if proto is None else proto
    return d


def test_the_same_build_is_admitted_as_exact_in_either_mode() -> None:
    for mixed in (False, True):
        v = judge_member(HOST, announced(HOST), mixed)
        assert v.admitted and v.exact and v.differences == ()


def test_another_build_is_refused_by_default_naming_what_differs() -> None:
    v = judge_member(HOST, announced(NATIVE), mixed_builds=False)
    assert not v.admitted
    assert "llama.cpp libraries: bbbbbbbbbbbbbbbb there, aaaaaaaaaaaaaaaa here" in v.reason
    assert "compiled CPU features" in v.reason and "--mixed-builds" in v.reason
    assert "llama-cpp-python version" not in v.reason  # only what differs is named


def test_another_build_is_admitted_with_mixed_builds_and_is_not_exact() -> None:
    v = judge_member(HOST, announced(NATIVE), mixed_builds=True)
    assert v.admitted and not v.exact
    assert [d.split(":")[0] for d in v.differences] == ["llama.cpp libraries", "compiled CPU features"]


def test_the_wire_protocol_must_match_even_with_mixed_builds() -> None:
    for mixed in (False, True):
        v = judge_member(HOST, announced(HOST, proto="kafila/0 frames/1 announce/2"), mixed)
        assert not v.admitted and "kafila/0 frames/1" in v.reason and wire_protocol() in v.reason
        v = judge_member(HOST, {"build": HOST}, mixed)  # an older Kafila announces no protocol at all
        assert not v.admitted and "announced no wire protocol version" in v.reason


def test_the_ring_is_mixed_only_while_a_differing_member_is_in_it() -> None:
    ring = RingBuilds(HOST)
    ring.add("ada", judge_member(HOST, announced(HOST), True))
    ring.add("bo", judge_member(HOST, announced(NATIVE), True))
    view = ring.for_members(["ada", "bo"])
    assert view["mode"] == "mixed" and not view["bit_exact"] and list(view["differ"]) == ["bo"]
    assert ring.for_members(["ada"]) == {"mode": "exact", "host": HOST, "bit_exact": True, "differ": {}}


@given(st.text(max_size=40), st.text(max_size=40))
def test_any_pair_of_tags_compares_without_error(a: str, b: str) -> None:
    diffs = build_differences(a, b)
    assert all(isinstance(d, str) and d for d in diffs)
    if len(a.split("/")) == 3 and len(b.split("/")) == 3:
        assert (diffs == []) == (a == b)
    else:
        assert len(diffs) == 1 and "not comparable" in diffs[0]

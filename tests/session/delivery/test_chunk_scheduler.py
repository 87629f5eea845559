"""The source scheduler on a fake clock: rarest first, the host last, liars dropped, stalls re-asked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.session.delivery.chunk_scheduler import ChunkScheduler, Kind, Request

pytestmark = pytest.mark.fast


def test_the_rarest_chunk_first_and_the_host_only_for_what_no_one_else_holds() -> None:
    s = ChunkScheduler()
    s.add_source("bo", Kind.PEER, holds=[0, 1, 2, 3], slots=2)
    s.add_source("cy", Kind.PEER, holds=[0, 1], slots=2)
    s.add_source("host", Kind.HOST, slots=8)
    s.want(range(6))
    got = s.next_requests(0.0)
    # bo: 2 and 3 (held by bo alone) before 0 and 1; cy: 0, 1; the host: only 4 and 5, which no peer holds
    assert sorted(got, key=lambda r: (r.source, r.chunk)) == [
        Request("bo", 2), Request("bo", 3), Request("cy", 0), Request("cy", 1), Request("host", 4),
        Request("host", 5)]


def test_a_url_takes_what_peers_lack_and_the_host_gets_nothing() -> None:
    s = ChunkScheduler()
    s.add_source("host", Kind.HOST, slots=8)
    s.add_source("url", Kind.URL, slots=2)
    s.add_source("bo", Kind.PEER, holds=[0], slots=1)
    s.want(range(4))
    got = s.next_requests(0.0)
    assert {r.source for r in got} == {"url", "bo"} and Request("bo", 0) in got and Request("url", 1) in got
    s.received("url", 1, 1 << 20, 1.0)
    assert s.next_requests(1.0) == [Request("url", 3)]


def test_a_liar_is_dropped_and_its_chunk_asked_elsewhere() -> None:
    s = ChunkScheduler()
    s.add_source("bo", Kind.PEER, holds=[0, 1], slots=2)
    s.add_source("host", Kind.HOST, slots=2)
    s.want([0, 1])
    assert {r.source for r in s.next_requests(0.0)} == {"bo"}
    s.refused("bo", 0)
    assert s.log == ["dropped bo for the rest of the session: chunk 0 from bo failed its sha256"]
    assert sorted(s.next_requests(0.0), key=lambda r: r.chunk) == [Request("host", 0), Request("host", 1)]


def test_a_stalled_source_is_replaced_and_its_late_chunk_still_taken() -> None:
    s = ChunkScheduler(stall_s=5.0, rest_s=30.0)
    s.add_source("url", Kind.URL, slots=1)
    s.add_source("host", Kind.HOST, slots=1)
    s.want([0])
    assert s.next_requests(0.0) == [Request("url", 0)]
    assert s.next_wakeup(0.0) == 5.0
    s.poll(4.9)
    assert s.next_requests(4.9) == []  # not stalled yet: the host is not asked
    s.poll(5.0)
    assert s.next_requests(5.0) == [Request("host", 0)]
    s.received("url", 0, 1 << 20, 6.0)  # the stalled source's chunk arrives after all
    assert s.complete and s.next_requests(6.0) == []
    assert s.next_wakeup(6.0) == 35.0  # the url rests until then


sources = st.lists(st.tuples(st.sampled_from([Kind.PEER, Kind.URL]), st.frozensets(st.integers(0, 19)),
                             st.integers(1, 4)), min_size=0, max_size=5)
# per step: which outstanding request to answer and how (arrives, fails its hash, fails, or time passes)
steps = st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(["ok", "ok", "ok", "lie", "fail", "stall"])),
                 max_size=200)


@settings(max_examples=300)
@given(sources=sources, wanted=st.frozensets(st.integers(0, 19), min_size=1), with_host=st.booleans(),
       steps=steps)
def test_requests_go_to_holders_never_to_the_dropped_and_to_the_host_last(
        sources: list[tuple[Kind, frozenset[int], int]], wanted: frozenset[int], with_host: bool,
        steps: list[tuple[int, str]]) -> None:
    s = ChunkScheduler(stall_s=5.0, rest_s=20.0)
    holds: dict[str, frozenset[int] | None] = {}
    for i, (kind, chunks, slots) in enumerate(sources):
        name = f"{kind.value}{i}"
        holds[name] = chunks if kind is Kind.PEER else None
        s.add_source(name, kind, holds=chunks if kind is Kind.PEER else None, slots=slots)
    if with_host:
        s.add_source("host", Kind.HOST, slots=3)
        holds["host"] = None
    s.want(sorted(wanted))
    now, dropped, outstanding, asked = 0.0, set(), [], set()

    def live_others(chunk: int) -> list[str]:
        return [n for n, src in s.sources.items() if n != "host" and src.live(now) and
                (holds[n] is None or chunk in holds[n])]  # type: ignore[operator]

    def pump() -> None:
        for r in s.next_requests(now):
            assert r.source not in dropped, "a dropped source was asked"
            assert holds[r.source] is None or r.chunk in holds[r.source], "asked of a source without it"  # type: ignore[operator]
            assert r.chunk in wanted and r.chunk not in s.done
            if r.source == "host":
                assert live_others(r.chunk) == [], "the host was asked while another live source holds it"
            outstanding.append(r)
            asked.add(r)

    for pick, what in [*steps, *[(0, "ok")] * 400]:  # then every answer good, so the run can finish
        pump()
        if not outstanding:
            now += 21.0  # everything left waits for a resting source (or can never come)
            s.poll(now)
            continue
        r = outstanding.pop(pick % len(outstanding))
        if what == "lie" and r.source != "host":  # the host is the authority: it does not lie
            s.refused(r.source, r.chunk)
            dropped.add(r.source)
            outstanding[:] = [o for o in outstanding if o.source != r.source]
        elif what == "fail":
            s.failed(r.source, r.chunk, now)
        elif what == "stall":
            now += 5.0
            s.poll(now)
            outstanding.append(r)
        else:
            now += 0.1
            s.received(r.source, r.chunk, 1 << 20, now)
    reachable = {c for c in wanted if any(holds[n] is None or c in holds[n]  # type: ignore[operator]
                                          for n in holds if n not in dropped)}
    # every wanted chunk a live source holds ended up requested of a source that holds it, and arrived
    assert reachable <= s.done
    for c in reachable:
        assert any(r.chunk == c and (holds[r.source] is None or c in holds[r.source])  # type: ignore[operator]
                   for r in asked)

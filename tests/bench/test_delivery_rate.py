"""The delivery-rate harness `bench scale` holds against aioquic: a real stage over one real link, two processes."""

from __future__ import annotations

import math

import pytest

from kafila.bench.delivery_rate import delivery_rate
from kafila.bench.quic_rate import kafila_datagram_size
from kafila.session.protocol.manifest import CHUNK_SIZE

pytestmark = [pytest.mark.fast, pytest.mark.timeout(300)]


@pytest.mark.parametrize("allow_direct", [True, False], ids=["direct", "relay"])
def test_a_stage_crosses_one_link_at_the_searched_datagram_size(allow_direct: bool) -> None:
    size = 3 * CHUNK_SIZE + 7
    r = delivery_rate(size, allow_direct=allow_direct)
    assert r["bytes"] == size and r["seconds"] > 0 and r["finish_s"] >= 0
    assert math.isclose(r["mb_per_s"], size / r["seconds"] / 1e6, rel_tol=1e-9)
    assert r["path"] == ("direct" if allow_direct else "relay")
    assert r["datagram_bytes"] == kafila_datagram_size(relay=not allow_direct)  # what aioquic alone is measured at


def test_the_host_feeds_several_members_at_once() -> None:
    """The aggregate is every member's bytes over the span of all: the slowest member's time.

    So it is exactly the slowest member's rate times the number of members, whatever the two
    transfers' speeds (the old check, at least the fastest member's rate, held only while the slower
    took at most twice the faster: not on a loaded machine); and it never exceeds the members' rates
    summed, which it would if the span were taken from a faster member.
    """
    size = 2 * CHUNK_SIZE + 1
    r = delivery_rate(size, members=2)
    assert r["members"] == 2 and r["bytes"] == 2 * size and len(r["per_member_mb_per_s"]) == 2
    assert math.isclose(r["mb_per_s"], r["bytes"] / r["seconds"] / 1e6, rel_tol=1e-9)
    rates = r["per_member_mb_per_s"]
    assert math.isclose(r["mb_per_s"], r["members"] * min(rates), rel_tol=1e-9), r
    assert min(rates) <= r["mb_per_s"] <= sum(rates) * (1 + 1e-9), r

"""Classification from evidence, and the probe order (filtering before anything goes to an alternate)."""

from __future__ import annotations

import pytest

from kafila.net import nat, stun
from kafila.planner.reachability import NatClass

pytestmark = pytest.mark.fast

M = ("100.64.0.11", 4000)


def test_classify_table() -> None:
    assert nat.classify(None, None, None, False, False) == NatClass.UNKNOWN
    assert nat.classify(M, M, M, True, False) == NatClass.PERMISSIVE
    assert nat.classify(M, M, M, False, True) == NatClass.PERMISSIVE
    assert nat.classify(M, ("100.64.0.11", 4001), M, False, False) == NatClass.RESTRICTIVE
    assert nat.classify(M, M, ("100.64.0.11", 9), False, False) == NatClass.RESTRICTIVE
    assert nat.classify(M, M, M, False, False) == NatClass.ORDINARY
    assert nat.classify(M, None, None, False, False) == NatClass.UNKNOWN


class FakeNat:
    """An in-memory NAT + rendezvous: EIM, and filtering that admits only endpoints already contacted."""

    def __init__(self, eif: bool) -> None:
        self.eif = eif
        self.contacted: set[tuple] = set()
        self.log: list[tuple] = []

    async def request(self, dst: tuple, change: int, timeout: float, tries: int) -> stun.StunMessage | None:
        self.log.append((dst, change))
        self.contacted.add(dst)
        origin = ((("100.64.0.3" if change & stun.CHANGE_IP else dst[0]),
                   (dst[1] + 1 if change & stun.CHANGE_PORT else dst[1])))
        if not self.eif and origin not in self.contacted:
            return None
        return stun.StunMessage(stun.BINDING_SUCCESS, b"t" * 12, mapped=M, origin=origin,
                                other=("100.64.0.3", 3479))


async def test_probe_tests_filtering_before_touching_the_alternates() -> None:
    fake = FakeNat(eif=False)
    rep = await nat.probe(fake.request, ("100.64.0.2", 3478), 0.01, 1)
    assert rep.nat_class == NatClass.ORDINARY  # the mapping probes must not open the filter first
    first_alt = next(i for i, (dst, _) in enumerate(fake.log) if dst != ("100.64.0.2", 3478))
    assert all(change for _, change in fake.log[1:first_alt]) and first_alt == 3
    assert (await nat.probe(FakeNat(eif=True).request, ("100.64.0.2", 3478), 0.01, 1)).nat_class == NatClass.PERMISSIVE

"""NAT classes and reachability prediction, by arithmetic alone (DESIGN §4).

Pair table (unordered): permissive–permissive, permissive–ordinary, permissive–restrictive and
ordinary–ordinary are predicted direct; ordinary–restrictive, restrictive–restrictive and every
pair with an unknown member are predicted relay (the safe side: never promise a direct path
nobody measured).

Counting rule for an all-direct ring, with p, o, r, u the numbers of permissive, ordinary,
restrictive and unknown members and m = p + o + r + u:

- m ≤ 1: trivially yes (no edges);
- u ≥ 1 (and m ≥ 2): no. An unknown member has no direct partner at all, so it is *not*
  counted as restrictive (that would let it sit between two permissive members, which the
  pair table forbids);
- otherwise: r = 0, or (o = 0 and r ≤ p), or (o ≥ 1 and r ≤ p − 1).

Why: a restrictive member needs permissive members on both sides, so restrictive members
sit alone in the gaps between consecutive permissive members of the ring of non-restrictive
members. There are p such gaps when o = 0 and at most p − 1 when some ordinary member must
also sit between two permissive ones. For m = 2 the single pair is used both ways and the
same arithmetic holds. `tests/planner` checks the rule against exhaustive search.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class NatClass(StrEnum):
    """How a member's NAT behaves, as the probe classifies it."""

    PERMISSIVE = "permissive"  # endpoint-independent filtering
    ORDINARY = "ordinary"  # endpoint-independent mapping, address-and-port-dependent filtering
    RESTRICTIVE = "restrictive"  # address-and-port-dependent (symmetric) mapping
    UNKNOWN = "unknown"  # probing blocked or inconclusive


DIRECT = "direct"
RELAY = "relay"

_DIRECT_PAIRS = {
    frozenset({NatClass.PERMISSIVE}),
    frozenset({NatClass.PERMISSIVE, NatClass.ORDINARY}),
    frozenset({NatClass.PERMISSIVE, NatClass.RESTRICTIVE}),
    frozenset({NatClass.ORDINARY}),
}


def predict_edge(a: NatClass, b: NatClass) -> str:
    """'direct' when a hole punch between these classes is expected to work, else 'relay'."""
    return DIRECT if frozenset({NatClass(a), NatClass(b)}) in _DIRECT_PAIRS else RELAY


def predict_all(classes: dict[str, NatClass]) -> dict[tuple[str, str], str]:
    """Prediction for every unordered pair of named members, keyed by (smaller name, larger name)."""
    names = sorted(classes)
    return {(a, b): predict_edge(classes[a], classes[b]) for i, a in enumerate(names) for b in names[i + 1 :]}


def all_direct_ring_exists(classes: Iterable[NatClass]) -> bool:
    """Whether some cyclic order of these members has every ring edge predicted direct (see module doc)."""
    cs = [NatClass(c) for c in classes]
    if len(cs) <= 1:
        return True
    if NatClass.UNKNOWN in cs:
        return False
    p, o, r = (cs.count(c) for c in (NatClass.PERMISSIVE, NatClass.ORDINARY, NatClass.RESTRICTIVE))
    return r == 0 or (o == 0 and r <= p) or (o >= 1 and r <= p - 1)

"""NAT classes and pairwise reachability prediction, by arithmetic alone (DESIGN §4)."""

from __future__ import annotations

from enum import Enum


class NatClass(str, Enum):
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

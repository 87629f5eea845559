"""Fixtures of the whole-session tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafila.lab.natlab import NatLab, available
from kafila.planner.reachability import NatClass
from tests.conftest import missing_tool

# The NAT lab's hosts: the host and one member behind ordinary NATs, two members behind restrictive ones
NATS = {1: NatClass.ORDINARY, 2: NatClass.ORDINARY, 3: NatClass.RESTRICTIVE, 4: NatClass.RESTRICTIVE}


@pytest.fixture(scope="module")
def lab() -> Iterator[NatLab]:
    """The emulated NAT lab with the NATS above (skipped without root or `nft`, a failure in CI)."""
    why = available()
    if why:
        missing_tool(why)
    with NatLab(nats=len(NATS)) as lab:
        for i, cls in NATS.items():
            lab.set_nat(i, cls)
        yield lab

"""`kafila bench nat` in the emulated NAT lab: the 9 ordered class pairs, each predicted as DESIGN §4 says,
verified with real packets, and usable (skipped without root and nftables on a developer machine; fails in CI)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kafila.lab.natlab import available
from kafila.planner.reachability import NatClass
from tests.conftest import missing_tool, run_kafila
from tests.planner.brute import direct

pytestmark = pytest.mark.slow

CLASSES = ("permissive", "ordinary", "restrictive")


def test_bench_nat_report(tmp_path: Path) -> None:
    why = available()
    if why:
        missing_tool(why)
    out = run_kafila("bench", "nat", "--json", "--out", str(tmp_path / "nat.json"),
                     env={"KAFILA_CACHE_DIR": str(tmp_path / "cache")}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc == json.loads((tmp_path / "nat.json").read_text())
    pairs = doc["pairs"]
    assert sorted((p["a"], p["b"]) for p in pairs) == sorted(itertools.product(CLASSES, CLASSES))
    for p in pairs:
        assert (p["a_measured"], p["b_measured"]) == (p["a"], p["b"]), p  # each NAT classified as built
        want = "direct" if direct(NatClass(p["a"]), NatClass(p["b"])) else "relay"
        assert p["predicted"] == want, p
        assert p["usable"] and p["error"] is None, p
        assert p["verified"] == want, p  # the lab's NATs behave as their classes say
    s = doc["summary"]
    assert (s["pairs_run"], s["classified_right"], s["usable"], s["unsafe_errors"]) == (9, 9, 9, 0)

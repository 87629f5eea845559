"""`kafila bench ring` runs real sessions end to end and writes a report of the promised shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_kafila
from tests.shared_probe import shared_probe_model

pytestmark = pytest.mark.slow


def test_bench_ring_report(tmp_path: Path) -> None:
    shared_probe_model(tmp_path / "cache")
    out = run_kafila("bench", "ring", "--json", "--tokens", "4", "--throttles", "1,2", "--strategies",
                     "kafila,uniform", "--out", str(tmp_path / "ring.json"),
                     env={"KAFILA_CACHE_DIR": str(tmp_path / "cache")}, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc == json.loads((tmp_path / "ring.json").read_text())
    lat = doc["latency"]
    assert lat["local_ms_per_token"] > 0 and lat["ring_ms_per_token"] > 0 and lat["pipe_ring_ms_per_token"] > 0
    assert len(lat["pipe_ring_stage_ms"]) == 3 and all(t > 0 for t in lat["pipe_ring_stage_ms"])
    for strategy in ("kafila", "uniform"):
        t = doc["throughput"][strategy]
        assert t["admitted"] and t["one_user_tokens_per_s"] > 0 and t["four_users_tokens_per_s"] > 0
        assert sorted(t["order"]) == ["ada", "bo"]
    assert doc["prediction"]["median_relative_error"] is not None

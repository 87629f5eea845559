"""Self-measurement: the cost fit recovers known parameters; a real probe gives sane numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.engine.probe import fit_cost, probe
from kafila.errors import EngineError
from kafila.model.describe import describe_model
from kafila.model.stage_cache import StageCache
from tests.conftest import run_kafila


@given(st.floats(1e8, 1e12), st.floats(0, 0.01))
def test_fit_recovers_exact_line(bandwidth: float, overhead: float) -> None:
    samples = [(b, overhead + b / bandwidth) for b in (1e6, 5e6, 2e7, 6e7)]
    b, o, resid = fit_cost(samples)
    assert b == pytest.approx(bandwidth, rel=1e-6)
    assert o == pytest.approx(overhead, abs=1e-9)
    assert resid < 1e-6


def test_fit_keeps_overhead_non_negative() -> None:
    b, o, _ = fit_cost([(1e6, 0.0001), (2e6, 0.0003), (4e6, 0.0007)])
    assert o == 0.0 and b > 0


def test_fit_refuses_flat_timings() -> None:
    with pytest.raises(EngineError, match="noisy"):
        fit_cost([(1e6, 0.002), (2e6, 0.001), (4e6, 0.0005)])


def test_probe_on_embedded_model(smollm: Path, stage_cache: StageCache) -> None:
    result = probe(smollm, stage_cache, sizes=(2, 12), calls=5)
    assert 1e8 < result.bandwidth_bytes_per_s < 1e12
    assert 0 <= result.dispatch_s < 0.05
    assert 0 < result.memory_bytes < result.available_bytes
    assert [s[0] for s in result.samples] == [2 * 2216448, 12 * 2216448]
    # the head cut (one block + the 28 MB output layer) against the fitted block speed
    info = describe_model(smollm)
    assert result.head_call_s > result.samples[0][1]
    unembed_s = result.head_call_s - result.dispatch_s - info.blocks_bytes[-1] / result.bandwidth_bytes_per_s
    assert result.unembed_bandwidth_bytes_per_s == pytest.approx(info.unembed_bytes / unembed_s)


def test_probe_cli_json(tmp_path: Path) -> None:
    out = run_kafila("probe", "--json", "--calls", "3", env={"KAFILA_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["bandwidth_bytes_per_s"] > 0 and doc["memory_bytes"] > 0


def test_bench_engine_report(tmp_path: Path) -> None:
    report_path = tmp_path / "engine.json"
    out = run_kafila("bench", "engine", "--json", "--tokens", "4", "--rounds", "1", "--out", str(report_path),
                     env={"KAFILA_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc == json.loads(report_path.read_text())
    assert set(doc["tokens_per_s"]) == {"single", "chain-1", "chain-2", "chain-3"}
    assert all(v > 0 for v in doc["tokens_per_s"].values())
    assert doc["physical_limit_tokens_per_s"] > 0

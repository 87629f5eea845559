"""`kafila plan` and `kafila bench planner` run as a user runs them: a subprocess of kafila.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]

GOOD_MEMBER = {
    "name": "laptop",
    "bandwidth_gbs": 100,
    "dispatch_ms": 0.3,
    "memory_gb": 12,
    "rtt_ms": 20,
    "nat": "ordinary",
}
MODEL = {
    "name": "tiny",
    "blocks_bytes": [1000, 1200, 1000, 1300],
    "kv_bytes_per_token": [10] * 4,
    "unembed_bytes": 500,
    "head_bytes": 900,
}


def kafila(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "kafila.py"), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def member(**changes: Any) -> dict[str, Any]:
    out = dict(GOOD_MEMBER, **changes)
    return {k: v for k, v in out.items() if v is not None}


def test_plan_json_for_a_feasible_fleet(tmp_path: Path) -> None:
    fleet = write(tmp_path, "f.json", {"members": [member(), member(name="desk", bandwidth_gbs=20, nat="permissive")]})
    model = write(tmp_path, "m.json", MODEL)
    r = kafila("plan", "--fleet", fleet, "--model", model, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["feasible"] and set(data["order"]) == {"laptop", "desk"}
    assert set(data["baselines"]) == {"uniform", "memory"}


def test_plan_human_output_and_strategy(tmp_path: Path) -> None:
    fleet = write(tmp_path, "f.json", {"members": [member(), member(name="desk", bandwidth_gbs=20)]})
    model = write(tmp_path, "m.json", MODEL)
    r = kafila("plan", "--fleet", fleet, "--model", model, "--strategy", "uniform")
    assert r.returncode == 0, r.stderr
    assert "laptop" in r.stdout and "uniform" in r.stdout and "bottleneck" in r.stdout


def test_plan_predicts_ttft_for_the_prompt_length_asked(tmp_path: Path) -> None:
    from kafila.planner.ttft import TtftModel

    prefill = {"prefill_bandwidth_gbs": 2, "prefill_dispatch_ms": 5, "prefill_block_ms": 20, "prefill_rows": 128}
    fleet = write(tmp_path, "f.json", {"members": [member(**prefill), member(name="desk", **prefill)]})
    model = write(tmp_path, "m.json", MODEL)
    r = kafila("plan", "--fleet", fleet, "--model", model, "--json", "--prompt-tokens", "500", "--batch", "64")
    assert r.returncode == 0, r.stderr
    ttft = json.loads(r.stdout)["ttft"]
    assert ttft["prompt_tokens"] == 500 and ttft["model"]["n_batch"] == 64
    assert ttft["seconds"] == TtftModel.from_json(ttft["model"]).predict(500) > 0
    text = kafila("plan", "--fleet", fleet, "--model", model, "--prompt-tokens", "500", "--batch", "64")
    assert text.returncode == 0
    assert f"time to first token: {ttft['seconds']:.2f} s predicted for a 500-token prompt" in text.stdout


def test_rejected_plan_exits_3_with_reasons(tmp_path: Path) -> None:
    fleet = write(tmp_path, "f.json", {"members": [member(memory_gb=0.000002), member(name="b", memory_gb=0.000002)]})
    model = write(tmp_path, "m.json", MODEL)
    r = kafila("plan", "--fleet", fleet, "--model", model, "--context", "100")
    assert r.returncode == 3, r.stderr
    assert "rejected" in r.stdout and "short by" in r.stdout
    j = kafila("plan", "--fleet", fleet, "--model", model, "--context", "100", "--json")
    assert j.returncode == 3 and json.loads(j.stdout)["feasible"] is False


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ({"members": [member(bandwidth_gbs=None)]}, 'fleet member 1 ("laptop"): missing field bandwidth_gbs'),
        (
            {"members": [member(), member(name="b", bandwidth_gbs=-1)]},
            'fleet member 2 ("b"): bandwidth_gbs must be > 0, got -1',
        ),
        ({"members": [member(bandwidth_gbs=0)]}, "bandwidth_gbs must be > 0, got 0"),
        ({"members": [member(unembed_bandwidth_gbs=0)]}, "unembed_bandwidth_gbs must be > 0, got 0"),
        ({"members": [member(nat="carrier-grade")]}, "nat must be one of permissive, ordinary, restrictive, unknown"),
        ({"members": [member(memory_gb="lots")]}, "memory_gb must be a number"),
        ({"members": [member(name="")]}, "fleet member 1: name must be a non-empty string"),
        ({"members": [member(), member()]}, "names must be unique"),
        ({"members": []}, "fleet: members is empty"),
        ({"nodes": []}, 'expected an object with a "members" list'),
        ({"members": [member(name=f"m{i}") for i in range(5)]}, "fleet members: 5 members but model"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_fleet_files_name_the_field(tmp_path: Path, fleet: Any, expected: str) -> None:
    r = kafila("plan", "--fleet", write(tmp_path, "f.json", fleet), "--model", write(tmp_path, "m.json", MODEL))
    assert r.returncode == 1
    assert r.stderr.startswith("kafila: error: ") and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"blocks_bytes": None}, "missing field blocks_bytes"),
        ({"kv_bytes_per_token": [10, 10]}, "kv_bytes_per_token has 2 entries, blocks_bytes has 4"),
        ({"blocks_bytes": [1000, 0, 1, 1]}, "blocks_bytes[1] must be an integer > 0, got 0"),
        ({"unembed_bytes": -5}, "unembed_bytes must be a non-negative integer"),
    ],
)
def test_bad_model_files_name_the_field(tmp_path: Path, change: dict[str, Any], expected: str) -> None:
    model = {k: v for k, v in dict(MODEL, **change).items() if v is not None}
    fleet = write(tmp_path, "f.json", {"members": [member()]})
    r = kafila("plan", "--fleet", fleet, "--model", write(tmp_path, "m.json", model))
    assert r.returncode == 1 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_missing_fleet_file(tmp_path: Path) -> None:
    r = kafila("plan", "--fleet", str(tmp_path / "nope.json"), "--model", write(tmp_path, "m.json", MODEL))
    assert r.returncode == 1 and "cannot read it" in r.stderr and "Traceback" not in r.stderr


def test_bench_planner_quick_json() -> None:
    r = kafila("bench", "planner", "--json", "--quick", timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["bench"] == "planner" and report["measured"]
    assert {(t["members"], t["blocks"]) for t in report["timing"]} == {(5, 32), (8, 80)}
    assert all(t["seconds"] > 0 and t["feasible"] for t in report["timing"])
    assert len(report["fleets"]) == 18  # 3 fleets × 6 models
    for row in report["fleets"]:
        if row["model"].startswith("Gemma 3 27B"):  # 62 blocks: llama.cpp computes a cut of it differently
            assert "only whole" in row["refused"]
            continue
        if "A3B" in row["model"] or "gpt-oss" in row["model"]:  # MoE: a decode batch of 4 reads more experts
            reads = row["read_bytes_per_call"]
            assert reads["1"] < reads["4"] < row["resident_bytes"]
        k = row["kafila"]
        assert k["feasible"]
        for s in ("uniform", "memory"):
            if row[s]["bottleneck_seconds"] is not None:
                assert k["bottleneck_seconds"] <= row[s]["bottleneck_seconds"]


def test_plan_reads_the_embedded_gguf_by_default(tmp_path: Path, smollm: Path) -> None:
    # `make setup` installs gguf and the embedded model: missing either is a failure here, never a skip
    fleet = write(tmp_path, "f.json", {"members": [member(), member(name="desk", bandwidth_gbs=20)]})
    r = kafila("plan", "--fleet", fleet, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["feasible"] and max(e for _, e in data["ranges"].values()) == 30  # SmolLM2-135M has 30 blocks

"""`kafila bench scale` end to end on the smallest shape: the report's structure and its internal consistency
(rates are bytes over seconds, both sides tokenised the same prompt, targets agree with their values);
no speed thresholds (those are the benchmark's to report)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from kafila.bench.scale import DECODE_ROUNDS, parse_shapes
from kafila.errors import ModelError
from kafila.model.random_gguf import SHAPES
from tests.conftest import run_kafila
from tests.shared_probe import shared_probe_model

pytestmark = pytest.mark.fast

TOKENS = 8
REPLY_TOKENS = 6


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


@pytest.mark.slow
def test_bench_scale_report(tmp_path: Path) -> None:
    """Two files of the tiny shape (3 and 4 blocks) on one probe: each run's report, and the pooled target."""
    cache = tmp_path / "cache"
    shared_probe_model(cache)
    out = run_kafila("bench", "scale", "--shape", "tiny,tiny:4", "--prompt-tokens", "150", "--tokens", str(TOKENS),
                     "--reply-tokens", str(REPLY_TOKENS),
                     "--quic-mb", "4", "--json", "--out", str(tmp_path / "scale.json"),
                     env={"KAFILA_CACHE_DIR": str(cache)}, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc == json.loads((tmp_path / "scale.json").read_text())
    assert doc["bench"] == "scale" and [(r["shape"], r["blocks"]) for r in doc["runs"]] == [("tiny", 3), ("tiny", 4)]
    assert doc["runs"][0]["model"] != doc["runs"][1]["model"]
    assert not [p for p in cache.iterdir() if p.name.startswith("bench-scale-")]  # scratch removed
    # the one probe the run measured is the one the user cache holds now
    saved = [json.loads(p.read_text())["result"] for p in cache.glob("probe-*-threads-*.json")]
    assert doc["probe"] in saved and doc["probe"]["bandwidth_bytes_per_s"] > 0
    for run in doc["runs"]:
        check_run(run, cache)
    errors = [e["error"] for run in doc["runs"] for e in run["stage_times"].values()]
    pooled = doc["targets"]["stage_time_error"]
    assert len(errors) == 6 and close(pooled["value"], statistics.median(errors))
    assert pooled["met"] == (pooled["value"] <= 0.10)


def check_run(doc: dict[str, Any], cache: Path) -> None:
    """One model's report: complete, and consistent within itself."""
    assert (cache / "models" / doc["model"]).stat().st_size == doc["model_bytes"]
    ring, local, quic = doc["ring"], doc["local"], doc["aioquic"]
    members = {"ada", "bo", "cy"}

    # stage delivery: every member got its stage; rates are bytes over seconds
    assert set(ring["delivery"]) == members
    for d in ring["delivery"].values():
        assert d["bytes"] > 0 and d["cut_s"] >= 0 and d["delivery_s"] > 0
        assert close(d["mb_per_s"], d["bytes"] / d["delivery_s"] / 1e6)
        assert d["loaded_s"] is not None and d["loaded_s"] >= d["delivery_s"]
    span = ring["delivery_all"]
    assert span["bytes"] == sum(d["bytes"] for d in ring["delivery"].values())
    assert span["seconds"] >= max(d["delivery_s"] for d in ring["delivery"].values())
    assert close(span["mb_per_s"], span["bytes"] / span["seconds"] / 1e6)
    assert quic["bytes"] == 4 << 20 and close(quic["mb_per_s"], quic["bytes"] / quic["seconds"] / 1e6)
    one = doc["delivery_one_link"]  # the like-for-like delivery: same bytes, same datagram size
    assert one["bytes"] == quic["bytes"] and one["datagram_bytes"] == quic["datagram_bytes"]
    assert close(one["mb_per_s"], one["bytes"] / one["seconds"] / 1e6) and one["path"] == "direct"
    for m in ring["delivery_rss_mb"].values():
        assert 0 < m["before"] <= m["peak"] and close(m["above"], m["peak"] - m["before"])

    # memory of every process, each member by name
    assert members | {"rendezvous", "host (this process)"} <= set(ring["peak_rss_mb"])
    assert all(mb > 0 for mb in ring["peak_rss_mb"].values()) and local["peak_rss_mb"] > 0

    # the same prompt, tokenised alike by the ring's head and the local context, reached a first token
    for t in (ring["ttft"], doc["ring_slowed"]["ttft"]):
        assert t["ok"], t
        assert t["ttft_s"] > 0 and t["prompt_tokens"] == local["prompt_tokens"] >= 100
    assert local["ttft_s"] > 0

    # the long prompt's greedy reply through both rings equals llama-cpp-python's greedy chat completion
    replies = doc["replies"]
    assert replies["llama_cpp"] and local["reply_tokens"] == REPLY_TOKENS
    for key in ("ring", "ring_slowed"):
        assert doc[key]["ttft"]["reply_tokens"] == REPLY_TOKENS
        assert replies[key] == {"reply": replies["llama_cpp"], "identical": True}, replies
    assert doc["targets"]["reply_identical"] == {"value": 1.0, "met": True,
                                                 "target": doc["targets"]["reply_identical"]["target"]}
    # the pipe floor: the same stages over OS pipes, one figure per stage
    assert doc["pipe_floor"]["ms_per_token"] > 0 and len(doc["pipe_floor"]["stage_ms"]) == 3
    assert sum(hi - lo for lo, hi in ring["ranges"].values()) == doc["blocks"]

    # decode: a random model never ends a reply early (its control tokens' output rows are zero)
    decode = ring["decode"]
    assert decode["completion_tokens"] == TOKENS and len(decode["rounds"]) == DECODE_ROUNDS
    assert all(r["completion_tokens"] == TOKENS and r["ring_ms"] > 0 and r["local_ms"] > 0 for r in decode["rounds"])
    assert close(decode["ms_per_token"], statistics.median(r["ring_ms"] for r in decode["rounds"]))
    assert close(decode["local_ms_per_token"], statistics.median(r["local_ms"] for r in decode["rounds"]))
    assert set(doc["stage_times"]) == members
    chain = ring["order"][1:] + ring["order"][:1]  # the pipe floor's stages: the head's last
    assert doc["pipe_floor"]["member_ms"] == dict(zip(chain, doc["pipe_floor"]["stage_ms"], strict=True))
    for name, e in doc["stage_times"].items():
        assert close(e["error"], abs(e["predicted_ms"] - e["measured_ms"]) / e["measured_ms"])
        assert e["alone_ms"] == doc["pipe_floor"]["member_ms"][name]
        assert close(e["alone_error"], abs(e["predicted_ms"] - e["alone_ms"]) / e["alone_ms"])

    # every target: met exactly when its value is on the right side of its limit
    t = doc["targets"]
    assert close(t["ttft_vs_local"]["value"], ring["ttft"]["ttft_s"] / local["ttft_s"])
    assert t["ttft_vs_local"]["met"] == (t["ttft_vs_local"]["value"] <= 1.3)
    ratios = [r["local_ms"] / r["ring_ms"] for r in decode["rounds"]]
    assert close(t["decode_vs_local"]["value"], statistics.median(ratios))
    assert t["decode_vs_local"]["met"] == (t["decode_vs_local"]["value"] >= 0.7)
    assert t["delivery_vs_aioquic"]["met"] == (t["delivery_vs_aioquic"]["value"] >= 0.9)
    assert t["stage_time_error"]["met"] == (t["stage_time_error"]["value"] <= 0.10)
    for key, run in (("ttft_prediction_error", ring), ("ttft_slowed_prediction_error", doc["ring_slowed"])):
        # both rings' plans predict TTFT, from the prompt's arrival at the head, which the head measures: the
        # client's own TTFT is later by the API's hop to the head and back
        pred, measured = run["plan_ttft_s"], run["ttft"]["stats"]["ttft"]["measured_s"]
        assert 0 < measured < run["ttft"]["ttft_s"]
        assert close(t[key]["value"], abs(pred - measured) / measured) and t[key]["met"] == (t[key]["value"] <= 0.25)
    for target in t.values():
        assert set(target) == {"value", "target", "met"}
        assert (target["met"] is None) == (target["value"] is None)


def test_bench_scale_on_a_missing_model_says_so_before_measuring(tmp_path: Path) -> None:
    out = run_kafila("bench", "scale", "--model", str(tmp_path / "absent.gguf"), "--json",
                     env={"KAFILA_CACHE_DIR": str(tmp_path / "cache")}, timeout=120)
    assert out.returncode != 0 and out.stdout == ""
    assert f"model not found: no file {tmp_path / 'absent.gguf'}" in out.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("probe-*"))  # nothing measured


def test_shapes_are_named_with_their_blocks() -> None:
    assert parse_shapes("llama3-8b, qwen3-32b:9", None) == [(SHAPES["llama3-8b"], 6), (SHAPES["qwen3-32b"], 9)]
    assert parse_shapes("llama3-8b,tiny:5", 4) == [(SHAPES["llama3-8b"], 4), (SHAPES["tiny"], 5)]
    with pytest.raises(ModelError, match="unknown model shape 'llama4'"):
        parse_shapes("llama3-8b,llama4", None)
    with pytest.raises(ModelError, match="'qwen3-32b:nine': blocks must be a whole number, as in qwen3-32b:9"):
        parse_shapes("qwen3-32b:nine", None)
    with pytest.raises(ModelError, match="'tiny:2': the benchmark's ring has 3 members and each holds at least one "
                                         "block: give tiny:3 or more"):
        parse_shapes("tiny:2", None)
    assert all(n >= 3 for _, n in parse_shapes(",".join(SHAPES), None))  # every shape's default fits the ring


def test_bench_scale_on_a_wrong_shape_says_so_before_measuring(tmp_path: Path) -> None:
    out = run_kafila("bench", "scale", "--shape", "tiny,nope", "--json",
                     env={"KAFILA_CACHE_DIR": str(tmp_path / "cache")}, timeout=120)
    assert out.returncode != 0 and out.stdout == ""
    assert "unknown model shape 'nope'" in out.stderr
    assert not (tmp_path / "cache" / "models").exists()  # not even the first shape's file was made

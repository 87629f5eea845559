"""The real Gemma 3 270M (a base model: no chat template) through a 2-member ring, as text completions.

Rendezvous, host and two members as real processes, `gemma3` named as a newcomer names it. The
greedy completion through `/v1/completions`, whole and streamed, equals llama-cpp-python's own
`create_completion` of the same prompt; a chat is refused by code (no chat template); and
`kafila chat` against the ring completes the raw text and says so once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafila.model.embedded import gemma3_model_path
from kafila.session.api.client import RAW_TEXT_NOTICE
from kafila.session.ring.chat_request import NO_CHAT_TEMPLATE
from tests.session.cluster import REPLY_TIMEOUT_S, REPO, Cluster

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def expected() -> str:
    """Ground truth: llama-cpp-python's greedy completion of the raw prompt on the whole file."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()  # route llama.cpp's log before Llama() would print it
    model = Llama(str(gemma3_model_path()), n_ctx=512, verbose=False)
    try:
        out = model.create_completion(PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        return str(out["choices"][0]["text"])  # type: ignore[index]
    finally:
        model.close()


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("gemma3-ring"), [("ada", []), ("bo", ["--throttle", "2"])],
                 host_args=["gemma3"]) as cluster:
        state = cluster.wait_phase({"admitted", "rejected"}, timeout=600)
        assert state["phase"] == "admitted", state.get("rejection")
        yield cluster


def post(ring: Cluster, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(ring.url + path, json.dumps(body).encode(), ring.headers())
    try:
        with urllib.request.urlopen(req, timeout=REPLY_TIMEOUT_S) as r:  # a hang bound
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_ring_splits_the_model_over_both_members(ring: Cluster) -> None:
    plan = ring.state()["plan"]
    assert sorted(plan["order"]) == ["ada", "bo"]
    assert all(end > start for start, end in plan["ranges"].values())


def test_greedy_completion_equals_llama_cpp(ring: Cluster, expected: str) -> None:
    status, raw = post(ring, "/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200, raw
    body = json.loads(raw)
    assert body["object"] == "text_completion" and body["model"].lower().startswith("gemma")
    assert body["choices"][0]["text"] == expected and len(expected) > 0


def test_streamed_completion_equals_llama_cpp(ring: Cluster, expected: str) -> None:
    status, raw = post(ring, "/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                 "stream": True})
    assert status == 200
    data = [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) == expected


def test_a_chat_is_refused_by_code(ring: Cluster) -> None:
    status, raw = post(ring, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]})
    assert status == 400 and json.loads(raw)["error"]["code"] == NO_CHAT_TEMPLATE


def test_kafila_chat_completes_raw_text_and_says_so_once(ring: Cluster, expected: str) -> None:
    # two lines: the notice comes with the first reply only; both are completed as raw text
    r = subprocess.run([sys.executable, str(REPO / "kafila.py"), "chat", "--api", ring.url, "--temperature", "0",
                        "--max-tokens", str(MAX_TOKENS)], input=f"{PROMPT}\n{PROMPT}\n/quit\n",
                       capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={**ring.env, "KAFILA_DATA_DIR": str(Path(ring.env["KAFILA_CACHE_DIR"]) / "data")})
    assert r.returncode == 0, r.stderr
    assert (r.stdout + r.stderr).count(RAW_TEXT_NOTICE) == 1
    assert r.stdout.count(f"kafila> {expected}") == 2, r.stdout

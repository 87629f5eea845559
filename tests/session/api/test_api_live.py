"""A live ring (rendezvous, host and members as real processes) against what a web page and a careless client send.

The cross-site POST (text/plain, a foreign Origin), the DNS-rebinding read of the state (a foreign
Host), and bodies that once crashed the head (`"temperature": null`, NaN, a string top_k): each is
refused or served, and afterwards every member still serves and a greedy chat gives the same text
as llama-cpp-python.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.session.cluster import REPLY_TIMEOUT_S, Cluster

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def llama_cpp_reply(smollm: Path) -> str:
    """Ground truth: llama-cpp-python's own greedy chat completion on the whole file."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()
    model = Llama(str(smollm), n_ctx=512, verbose=False)
    try:
        out = model.create_chat_completion([{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS,
                                           temperature=0)
        return str(out["choices"][0]["message"]["content"])  # type: ignore[index]
    finally:
        model.close()


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("hostile"), [("ada", []), ("bo", ["--throttle", "2"])])
    try:
        cluster.wait_phase({"admitted"})
        yield cluster
    finally:
        assert cluster.stop() == [], "processes hung on shutdown"


def send(ring: Cluster, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, Any]:
    """One request with exactly these headers (http.client adds no Host of its own here)."""
    port = urlsplit(ring.url).port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REPLY_TIMEOUT_S)  # a hang bound
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_hostile_requests_leave_the_ring_serving_the_same_text(ring: Cluster, llama_cpp_reply: str) -> None:
    port = urlsplit(ring.url).port
    own = {"Host": f"127.0.0.1:{port}", **ring.headers()}
    chat = json.dumps({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}).encode()

    # a web page's "simple" POST: text/plain, its own Origin, no token (it cannot read the file)
    status, body = send(ring, "POST", "/v1/chat/completions",
                        {"Host": f"127.0.0.1:{port}", "Origin": "https://evil.example", "Content-Type": "text/plain"},
                        chat)
    assert status == 403 and body["error"]["code"] == "foreign_origin"
    status, body = send(ring, "POST", "/v1/chat/completions", {**own, "Content-Type": "text/plain"}, chat)
    assert status == 415
    # DNS rebinding: the page's own name resolves to 127.0.0.1, so the Host is the page's (token or not)
    for headers in ({"Host": "rebind.example.com"}, {**own, "Host": f"rebind.example.com:{port}"}):
        status, body = send(ring, "GET", "/kafila/state", headers)
        assert status == 403 and "members" not in body
    # bodies that once took the head (and, through re-sending, every next head) down
    for bad in (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "x"}',
                b'{"messages": [{"role": "user", "content": "hi"}], "top_k": "40"}',
                b'{"messages": [{"role": "user", "content": "' + b"word " * 3000 + b'"}]}'):
        status, body = send(ring, "POST", "/v1/chat/completions", own, bad)
        assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "the context holds 512" in body["error"]["message"]  # the last: counted by the head, not the API
    status, body = send(ring, "POST", "/v1/chat/completions", own,
                        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": null, "max_tokens": 4}')
    usage = body["usage"]
    assert status == 200 and 1 <= usage["completion_tokens"] <= 4  # sampled (0.7): it may end before 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    state = ring.state()
    assert state["phase"] == "admitted" and state["lost"] is None and state["code"] is None
    assert {m["status"] for n, m in state["members"].items() if n in ("ada", "bo")} == {"serving"}
    assert ring.code.split("-", 1)[1].replace("-", "") not in json.dumps(state).replace("-", "")
    reply = ring.chat(PROMPT, MAX_TOKENS)
    assert reply["choices"][0]["message"]["content"] == llama_cpp_reply

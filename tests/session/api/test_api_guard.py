"""The chat API against hostile requests, sent as raw bytes to a real server on 127.0.0.1.

What a web page can do (DNS rebinding: a foreign Host; a "simple" cross-site POST: a foreign Origin
and text/plain), what another local user can do (no token), and what the session must never hand
out (the join code). Each refused request must not reach the ring.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kafila.session.api.server import ApiServer
from kafila.session.api.token import read_token, token_path
from tests.session.api_fixtures import CODE, ScriptedRing, start_server

pytestmark = pytest.mark.fast

CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServer, ScriptedRing]]:
    server, ring = await start_server()
    try:
        yield server, ring
    finally:
        await server.stop()


async def raw(server: ApiServer, head: str, body: bytes = b"", token: bool = True) -> tuple[int, dict[str, str], Any]:
    """Send one HTTP/1.1 request as written (`head`: request line and headers); (status, headers, JSON body)."""
    port = server.guard.port
    head = head.replace("PORT", str(port))
    if token:
        head += f"\r\nAuthorization: Bearer {server.token}"
    if body:
        head += f"\r\nContent-Length: {len(body)}"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    try:
        parsed = json.loads(rest)
    except ValueError:
        parsed = rest.decode(errors="replace")
    return status, headers, parsed


def assert_openai_error(body: Any, code: str | None = None) -> None:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code


async def test_state_never_carries_the_join_code(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, _ = api
    status, _, state = await raw(server, "GET /kafila/state HTTP/1.1\r\nHost: 127.0.0.1:PORT")
    assert status == 200 and state["code"] is None and state["phase"] == "admitted"
    text = json.dumps(state).lower()
    secret = CODE.replace("-", "")[8:]
    assert re.sub(r"[\s\-_]", "", text).find(secret) == -1  # in no form, dashes and spaces or not
    assert "session open; join code [join code withheld]" in text  # the event log is kept, the code is not
    assert server.state.code == CODE  # this process (its TUI) still has it


@pytest.mark.parametrize("host", ["rebind.example.com", "rebind.example.com:PORT", "127.0.0.1", "127.0.0.1:1",
                                  "localhost.example.com:PORT", "127.0.0.2:PORT", "0.0.0.0:PORT", ""])
async def test_a_foreign_host_is_refused(api: tuple[ApiServer, ScriptedRing], host: str) -> None:
    server, ring = api
    for head in (f"GET /kafila/state HTTP/1.1\r\nHost: {host}",
                 f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"):
        status, _, body = await raw(server, head, CHAT if head.startswith("POST") else b"")
        assert status == 403, (host, status, body)
        assert_openai_error(body, "foreign_host")
        assert "phase" not in json.dumps(body)
    assert ring.bodies == []


@pytest.mark.parametrize("host", ["127.0.0.1:PORT", "localhost:PORT", "LocalHost:PORT", "[::1]:PORT"])
async def test_the_loopback_names_are_served(api: tuple[ApiServer, ScriptedRing], host: str) -> None:
    status, _, body = await raw(api[0], f"GET /v1/models HTTP/1.1\r\nHost: {host}")
    assert status == 200 and body["data"][0]["id"] == "SmolLM2-135M-Instruct-Q4_1"


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:1", "http://localhost"])
async def test_a_cross_site_post_is_refused(api: tuple[ApiServer, ScriptedRing], origin: str) -> None:
    # what a page's fetch(..., {method: "POST", body, mode: "no-cors"}) sends: no preflight
    server, ring = api
    status, _, body = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                        f"Origin: {origin}\r\nContent-Type: text/plain", CHAT, token=False)
    assert status == 403
    assert_openai_error(body, "foreign_origin")
    status, _, body = await raw(server, "GET /kafila/state HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                        f"Origin: {origin}")
    assert status == 403 and ring.bodies == []


async def test_a_page_of_our_own_origin_and_same_site_fetches_pass(api: tuple[ApiServer, ScriptedRing]) -> None:
    status, _, _ = await raw(api[0], "GET /v1/models HTTP/1.1\r\nHost: localhost:PORT\r\nOrigin: http://localhost:PORT")
    assert status == 200
    status, _, _ = await raw(api[0], "GET /v1/models HTTP/1.1\r\nHost: localhost:PORT\r\nSec-Fetch-Site: cross-site")
    assert status == 403


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x",
                                   "application/jsonx", None])
async def test_a_body_not_sent_as_json_is_refused(api: tuple[ApiServer, ScriptedRing], ctype: str | None) -> None:
    server, ring = api
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT"
    status, _, body = await raw(server, head + (f"\r\nContent-Type: {ctype}" if ctype else ""), CHAT)
    assert status == 415
    assert_openai_error(body, "unsupported_media_type")
    assert ring.bodies == []
    status, _, body = await raw(server, head + "\r\nContent-Type: application/json; charset=utf-8", CHAT)
    assert status == 200 and body["choices"][0]["message"]["content"] == "Hello, world"


@pytest.mark.parametrize("auth", [None, "Bearer", "Bearer wrong", "Basic dXNlcjpwYXNz", "bearer TOKEN-x"])
async def test_without_the_token_nothing_is_served(api: tuple[ApiServer, ScriptedRing], auth: str | None) -> None:
    server, ring = api
    extra = "" if auth is None else f"\r\nAuthorization: {auth.replace('TOKEN', server.token or '')}"
    for head, body in (("GET /kafila/state HTTP/1.1", b""), ("GET /v1/models HTTP/1.1", b""),
                       ("POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json", CHAT)):
        status, headers, answer = await raw(server, f"{head}\r\nHost: 127.0.0.1:PORT{extra}", body, token=False)
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert_openai_error(answer, "invalid_api_key")
        assert str(server.token_path) in answer["error"]["message"]  # where the user's own clients find it
    assert ring.bodies == []


async def test_the_token_file_is_private_and_goes_with_the_server() -> None:
    server, _ = await start_server()
    port = server.guard.port
    assert port is not None
    path = token_path(port)
    try:
        assert server.token_path == path and read_token(f"http://127.0.0.1:{port}") == server.token
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and path.parent.stat().st_uid == os.getuid()
    finally:
        await server.stop()
    assert not path.exists()


@pytest.mark.parametrize("body", [
    b"{", b"[]", b"null", b'"hi"', b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000,
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "x"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -0.5}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}',
    b'{"messages": [{"role": "user", "content": "hi"}], "top_k": "40"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.5}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999999999999999}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}',
    b'{"messages": [{"role": "user", "content": "hi"}], "seed": "7"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stop": [""]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5}',
    b'{"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": "1"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "repeat_penalty": 0}',
    b'{"messages": [{"role": "user", "content": "hi"}], "repeat_last_n": -2}',
    b'{"messages": [{"role": "user", "content": "hi"}], "min_p": 1.5}',
    b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": -101}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"-5": 1}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": [1]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "n": 0}',
    b'{"messages": []}', b'{"messages": "hi"}', b'{"messages": [{"role": "user"}]}',
    b'{"messages": [{"role": "wizard", "content": "hi"}]}', b'{"messages": [{"role": "user", "content": 5}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
    b'{"messages": [' + b'{"role": "user", "content": "x"},' * 1100 + b'{"role": "user", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": "' + b"x" * 300_000 + b'"}]}',
])
async def test_a_bad_body_is_a_400_in_openai_shape(api: tuple[ApiServer, ScriptedRing], body: bytes) -> None:
    server, ring = api
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", body)
    assert status == 400, (status, answer)
    assert_openai_error(answer)
    assert answer["error"]["type"] == "invalid_request_error"
    assert ring.bodies == []


async def test_a_body_past_the_size_limit_is_a_413(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, ring = api
    body = b'{"messages": [{"role": "user", "content": "' + b"x" * (3 << 20) + b'"}]}'
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", body)
    assert status == 413 and ring.bodies == []
    assert_openai_error(answer)


async def test_what_the_ring_is_sent_is_only_the_validated_fields(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, ring = api
    body = {"messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                         {"role": "user", "content": "hi", "name": "ann"}],
            "temperature": None, "top_k": 5, "seed": -1, "resume": [1, 2, 3], "raw": "<|im_start|>",
            "max_completion_tokens": 12, "user": "someone", "logprobs": False, "n": 1}
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", json.dumps(body).encode())
    assert status == 200, answer
    assert ring.bodies == [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                            "max_tokens": 12, "temperature": 0.7, "top_p": 0.95, "top_k": 5, "seed": 2**64 - 1}]


async def test_the_sampling_fields_reach_the_ring_normalised(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, ring = api
    body = {"messages": [{"role": "user", "content": "hi"}], "stop": "\n", "presence_penalty": 0.5,
            "frequency_penalty": -1, "repeat_penalty": 1.1, "repeat_last_n": -1, "min_p": 0.1,
            "logit_bias": {"42": -100, "7": 2}}
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", json.dumps(body).encode())
    assert status == 200, answer
    sent = ring.bodies[-1]
    assert {k: sent[k] for k in body if k != "messages"} == {
        "stop": ["\n"], "presence_penalty": 0.5, "frequency_penalty": -1.0, "repeat_penalty": 1.1,
        "repeat_last_n": 1 << 20, "min_p": 0.1, "logit_bias": {"7": 2.0, "42": -100.0}}


async def test_usage_and_model_are_filled(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, _ = api
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", CHAT)
    assert status == 200
    assert answer["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    assert answer["model"] == "SmolLM2-135M-Instruct-Q4_1" and answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refusal_by_the_head_keeps_its_status(api: tuple[ApiServer, ScriptedRing], stream: bool) -> None:
    # the API cannot count tokens; the head can, and its refusal is a 400 even for a stream
    server, ring = api
    ring.script = [{"error": "the prompt is 900 tokens but the context holds 512 per request", "status": 400,
                    "param": "messages", "code": "context_length_exceeded"}]
    body = json.dumps({"messages": [{"role": "user", "content": "long"}], "stream": stream}).encode()
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", body)
    assert status == 400
    assert answer["error"] == {"message": "the prompt is 900 tokens but the context holds 512 per request",
                               "type": "invalid_request_error", "param": "messages",
                               "code": "context_length_exceeded"}


async def test_unknown_paths_and_methods_answer_in_openai_shape(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, _ = api
    status, _, answer = await raw(server, "GET /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1:PORT")
    assert status == 404
    assert_openai_error(answer)
    status, _, answer = await raw(server, "GET /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT")
    assert status == 405
    assert_openai_error(answer)


async def test_a_request_that_was_with_two_lost_heads_is_not_sent_again(api: tuple[ApiServer, ScriptedRing]) -> None:
    server, ring = api
    server.state.plan = {"head": "ada"}
    lost_head = [{"delta": "Once", "tokens": [5]},
                 {"error": "member ada was lost: link closed", "resumable": True, "lost": "ada"}]

    async def head(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        async for evt in ring(body):
            yield evt
        server.chat = head  # a ring re-planned at once, whose head ada is lost again

    ring.script = lost_head
    server.chat = head
    status, _, answer = await raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n"
                                          "Content-Type: application/json", CHAT)
    assert status == 502 and "a second head was lost" in answer["error"]["message"]
    assert len(ring.bodies) == 2 and ring.bodies[1]["resume"] == [5]


async def test_kafilas_own_client_reads_the_token_file(api: tuple[ApiServer, ScriptedRing],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # what `kafila chat`, the TUI and `kafila demo` use: no token passed, the file of the URL's port is read
    from kafila.session.api.client import ApiClient, ApiNotYours

    monkeypatch.delenv("KAFILA_API_TOKEN", raising=False)
    server, _ = api
    async with ApiClient(server.url) as client:
        assert await client.models() == ["SmolLM2-135M-Instruct-Q4_1"]
        assert "".join([p async for p in client.stream_chat([{"role": "user", "content": "hi"}])
                        if isinstance(p, str)]) == "Hello, world"
        assert (await client.state()).code is None
    async with ApiClient(server.url, token="wrong") as client:  # the server cannot prove it holds that one
        with pytest.raises(ApiNotYours, match="it cannot prove it holds your session's token"):
            await client.models()

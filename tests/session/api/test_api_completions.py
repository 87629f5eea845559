"""`POST /v1/completions` (raw text, for base models too) on the real ApiServer, a scripted ring behind it.

What the ring is sent (the normalised body with `prompt`), the text_completion shapes (whole and
streamed, `data: [DONE]` last), the validation every field gets (the chat endpoint's guard, error
shape and limits), and the official `openai` package's `client.completions.create`. The text itself
is checked against llama.cpp in test_completions_head.py and on a real ring in test_completions_ring.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from kafila.session.api.server import ApiServer
from kafila.session.ring.chat_request import MAX_CONTENT_CHARS
from tests.session.api_fixtures import MODEL, REPLY, ScriptedRing

pytestmark = pytest.mark.fast

PROMPT = "The capital of France is"
TOO_LONG = {"error": "the prompt is 900 tokens but the context holds 512 per request; shorten it", "status": 400,
            "param": "prompt", "code": "context_length_exceeded"}


def post(server: ApiServer, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    """(status, content type, body: parsed JSON, or the SSE data lines of a stream)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}", **(headers or {})}
    req = urllib.request.Request(server.url + "/v1/completions", data, head)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, kind, raw = r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        status, kind, raw = exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()
    if "text/event-stream" in kind:
        lines = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
        return status, kind, [line if line == "[DONE]" else json.loads(line) for line in lines]
    return status, kind, json.loads(raw)


def test_a_whole_completion(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing) -> None:
    status, _, body = post(served[0], {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                       "top_p": 0.5, "seed": 7, "stop": "\n"})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL
    assert body["choices"] == [{"index": 0, "text": "".join(REPLY), "finish_reason": "stop", "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    # the ring got the normalised body: the raw prompt, no messages, the stop list
    assert ring.bodies[-1] == {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "top_p": 0.5, "top_k": 40,
                               "seed": 7, "stop": ["\n"]}


def test_the_default_length_is_openais(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing) -> None:
    assert post(served[0], {"prompt": PROMPT})[0] == 200
    assert ring.bodies[-1]["max_tokens"] == 16 and "stop" not in ring.bodies[-1]


def test_a_streamed_completion(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing) -> None:
    status, kind, chunks = post(served[0], {"prompt": PROMPT, "stream": True,
                                            "stream_options": {"include_usage": True}})
    assert status == 200 and kind.startswith("text/event-stream")
    assert chunks[-1] == "[DONE]"
    objects = chunks[:-1]
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in objects)
    texts = [c["choices"][0]["text"] for c in objects if c["choices"]]
    assert "".join(texts) == "".join(REPLY)
    assert [c["choices"][0]["finish_reason"] for c in objects if c["choices"]] == [None, None, "stop"]
    assert objects[-1]["choices"] == [] and objects[-1]["usage"]["total_tokens"] == 11


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"), ({"prompt": None}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 2]}, "prompt"),
    ({"prompt": "x" * (MAX_CONTENT_CHARS + 1)}, "prompt"),
    ({"prompt": PROMPT, "temperature": 3}, "temperature"), ({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
    ({"prompt": PROMPT, "top_p": -1}, "top_p"), ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": 1 << 21}, "max_tokens"), ({"prompt": PROMPT, "seed": "s"}, "seed"),
    ({"prompt": PROMPT, "stream": "yes"}, "stream"), ({"prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": PROMPT, "stop": [""]}, "stop"), ({"prompt": PROMPT, "stop": 5}, "stop"),
    ({"prompt": PROMPT, "echo": True}, "echo"), ({"prompt": PROMPT, "n": 0}, "n"),
    ({"prompt": PROMPT, "logprobs": 6}, "logprobs"), ({"prompt": PROMPT, "suffix": "end"}, "suffix"),
    ({"prompt": PROMPT, "best_of": 3}, "best_of"), ({"prompt": PROMPT, "model": 5}, "model"),
    ({"prompt": PROMPT, "resume": [1, 2]}, None),  # a client's `resume` is dropped, not trusted: served
])
def test_bad_fields_are_400s_naming_the_field(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing,
                                              body: dict[str, Any], param: str | None) -> None:
    before = len(ring.bodies)
    status, _, answer = post(served[0], body)
    if param is None:
        assert status == 200 and "resume" not in ring.bodies[-1]
        return
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["type"] == "invalid_request_error"
    assert param in answer["error"]["message"]
    assert len(ring.bodies) == before  # refused before the ring


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"prompt": NaN}'])
def test_bodies_that_are_not_objects_are_400s(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing,
                                              body: bytes) -> None:
    status, _, answer = post(served[0], body)
    assert status == 400 and answer["error"]["code"] in ("invalid_json", "invalid_type")


def test_the_guard_stands_in_front(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing) -> None:
    server, before = served[0], len(ring.bodies)
    assert post(server, {"prompt": PROMPT}, {"Authorization": "Bearer wrong"})[0] == 401
    assert post(server, {"prompt": PROMPT}, {"Content-Type": "text/plain"})[0] == 415
    assert post(server, {"prompt": PROMPT}, {"Origin": "https://evil.example"})[0] == 403
    assert len(ring.bodies) == before


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_is_a_400_with_the_numbers(served: tuple[ApiServer, ScriptedRing],
                                                            ring: ScriptedRing, stream: bool) -> None:
    ring.script = [TOO_LONG]
    status, _, answer = post(served[0], {"prompt": PROMPT, "stream": stream})
    assert status == 400
    assert answer["error"] == {"message": TOO_LONG["error"], "type": "invalid_request_error", "param": "prompt",
                               "code": "context_length_exceeded"}


def test_a_ring_error_mid_stream_ends_it_with_an_error_chunk(served: tuple[ApiServer, ScriptedRing],
                                                             ring: ScriptedRing) -> None:
    ring.script = [{"delta": "Par", "tokens": [1]}, {"error": "the ring broke"}]
    status, _, chunks = post(served[0], {"prompt": PROMPT, "stream": True})
    assert status == 200 and chunks[0]["choices"][0]["text"] == "Par"
    assert chunks[1]["error"]["message"] == "the ring broke" and chunks[-1] == "[DONE]"


def test_not_serving_is_a_503(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing) -> None:
    server = served[0]
    server.chat = None
    try:
        status, _, answer = post(server, {"prompt": PROMPT})
    finally:
        server.chat = ring
    assert status == 503 and answer["error"]["code"] == "not_serving"


# -- the official client ------------------------------------------------------------------------------
def test_openai_completions_create(client: openai.OpenAI, ring: ScriptedRing) -> None:
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=["\n\n"])
    assert reply.object == "text_completion" and reply.model == MODEL
    assert reply.choices[0].text == "".join(REPLY) and reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens == 11
    assert ring.bodies[-1]["prompt"] == PROMPT and ring.bodies[-1]["stop"] == ["\n\n"]


def test_openai_completions_streamed(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "".join(REPLY)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


def test_openai_completions_refused(client: openai.OpenAI, ring: ScriptedRing) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=5)
    assert caught.value.status_code == 400 and caught.value.param == "temperature"
    ring.script = [TOO_LONG]
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt=PROMPT, stream=True)
    assert too_long.value.code == "context_length_exceeded" and "900 tokens" in too_long.value.message


def test_cache_prompt_is_llama_servers_flag_a_bool_carried_to_the_head() -> None:
    from kafila.session.ring.chat_request import BadRequest, parse_chat, parse_completion

    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat(chat).cache_prompt and "cache_prompt" not in parse_chat(chat).body()
    fresh = parse_completion({"prompt": "hi", "cache_prompt": False})
    assert not fresh.cache_prompt and fresh.body()["cache_prompt"] is False
    assert not parse_completion(fresh.body(), internal=True).cache_prompt  # the head reads what the API sent
    with pytest.raises(BadRequest) as refused:
        parse_chat({**chat, "cache_prompt": "no"})
    assert refused.value.param == "cache_prompt"

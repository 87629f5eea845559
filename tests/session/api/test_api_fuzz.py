"""Fuzzing the chat body: any JSON is either run or refused with a 400 in OpenAI's shape; never a 5xx, never a crash.

Once on the validator itself (fast, many examples), once over HTTP against a real server (the whole
path a body takes: parsing, the guard, validation, the handler).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafila.engine.sampler import SamplingParams
from kafila.session.api.server import ApiServer
from kafila.session.ring.chat_request import (
    MAX_CONTENT_CHARS,
    MAX_STOP,
    BadRequest,
    ChatRequest,
    parse_chat,
    parse_completion,
    parse_request,
)
from tests.session.api_fixtures import ScriptedRing

pytestmark = pytest.mark.fast

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
any_json = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "", "USER"]) | scalars
contents = st.text(max_size=30) | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=9)})
                                           | any_json, max_size=3) | scalars
calls = st.lists(st.fixed_dictionaries({"id": st.text(max_size=5) | scalars, "type": st.just("function") | scalars,
                                        "function": st.fixed_dictionaries({}, optional={
                                            "name": st.text(max_size=5) | scalars,
                                            "arguments": st.text(max_size=9) | any_json}) | scalars}),
                 max_size=2) | any_json
message = st.fixed_dictionaries({}, optional={"role": roles, "content": contents, "name": scalars,
                                              "tool_calls": calls, "tool_call_id": scalars}) | any_json
tool = st.fixed_dictionaries({"type": st.just("function") | scalars, "function": st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["f", "get_weather", "bad name"]) | scalars, "description": scalars,
    "parameters": st.just({"type": "object", "properties": {"x": {"type": "integer"}}}) | any_json}) | scalars})
tool_choices = st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]) | any_json
numbers = st.integers(-(2**70), 2**70) | st.floats() | st.sampled_from([0, 1, 2, 0.0, 1.0, 2.0, 1e-310, 40, 256])
fields = {"messages": st.lists(message, max_size=4) | any_json, "temperature": numbers | scalars,
          "top_p": numbers | scalars, "top_k": numbers | scalars, "max_tokens": numbers | scalars,
          "max_completion_tokens": numbers | scalars, "seed": numbers | scalars, "stream": scalars,
          "stream_options": any_json, "model": scalars, "stop": any_json, "n": numbers, "logprobs": scalars,
          "resume": any_json, "raw": scalars, "response_format": any_json, "json_schema": any_json,
          "grammar": any_json, "tools": st.lists(tool, max_size=2) | any_json, "tool_choice": tool_choices,
          "parallel_tool_calls": scalars}
valid_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                       "content": st.text(max_size=30)})
valid = st.fixed_dictionaries({"messages": st.lists(valid_message, min_size=1, max_size=3)}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(0, 100),
    "max_tokens": st.integers(1, 500), "seed": st.integers(-(2**63), 2**64 - 1), "stream": st.booleans(),
    "model": st.text(max_size=10), "n": st.just(1), "stop": st.none(),
    "stream_options": st.just({"include_usage": True})})
# a valid body with up to two fields replaced by anything: reaches every check; then wholly hostile ones
mutated = st.builds(lambda base, changes: {**base, **changes}, valid,
                    st.dictionaries(st.sampled_from(sorted(fields)), numbers | any_json, max_size=2))
bodies = valid | mutated | st.fixed_dictionaries({}, optional=fields) | any_json


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(bodies)
def test_the_validator_accepts_or_names_the_bad_field(body: Any) -> None:
    try:
        chat = parse_chat(body)
    except BadRequest as exc:
        assert str(exc) and exc.code
        assert exc.param is None or isinstance(exc.param, str)
        return
    # what it accepts, the head can run: the sampler takes it, the numbers are finite, nothing else got in
    assert isinstance(chat, ChatRequest) and chat.messages and chat.resume == ()
    assert isinstance(chat.sampling(), SamplingParams)
    assert math.isfinite(chat.temperature) and 0 <= chat.temperature <= 2 and 0 <= chat.top_p <= 1
    assert 1 <= chat.max_tokens and sum(m.size for m in chat.messages) <= MAX_CONTENT_CHARS
    # the head reads the forwarded body the same way (streaming is the API's business, not the head's)
    assert parse_chat(chat.body(), internal=True) == dataclasses.replace(chat, stream=False, include_usage=False)
    json.dumps(chat.body(), allow_nan=False)


completion_fields = {**{k: v for k, v in fields.items() if k != "messages"}, "prompt": st.text(max_size=30) | any_json,
                     "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6) | any_json,
                     "echo": scalars, "suffix": scalars, "best_of": numbers}
valid_completion = st.fixed_dictionaries({"prompt": st.text(max_size=30)}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "max_tokens": st.integers(1, 500),
    "seed": st.integers(-(2**63), 2**64 - 1), "stream": st.booleans(), "echo": st.just(False),
    "stop": st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1, max_size=5), max_size=4)})
completion_bodies = (valid_completion | st.builds(lambda base, changes: {**base, **changes}, valid_completion,
                                                  st.dictionaries(st.sampled_from(sorted(completion_fields)),
                                                                  numbers | any_json, max_size=2))
                     | st.fixed_dictionaries({}, optional=completion_fields) | any_json)


@settings(max_examples=1000, deadline=None)
@given(completion_bodies)
def test_the_completion_validator_accepts_or_names_the_bad_field(body: Any) -> None:
    try:
        req = parse_completion(body)
    except BadRequest as exc:
        assert str(exc) and exc.code and (exc.param is None or isinstance(exc.param, str))
        return
    assert isinstance(req.prompt, str) and req.messages == () and req.resume == ()
    assert len(req.stop) <= MAX_STOP and all(isinstance(s, str) and s for s in req.stop)
    assert isinstance(req.sampling(), SamplingParams) and 1 <= req.max_tokens
    # the head tells it from a chat by its forwarded body, and reads it back the same
    assert parse_request(req.body(), internal=True) == dataclasses.replace(req, stream=False, include_usage=False)
    json.dumps(req.body(), allow_nan=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_any_json_body_over_http_is_served_or_a_400(served: tuple[ApiServer, ScriptedRing], body: Any) -> None:
    server, ring = served
    sent = len(ring.bodies)
    conn = http.client.HTTPConnection("127.0.0.1", server.guard.port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status == 200:
        n = body.get("n") or 1  # one request toward the head per choice
        assert len(ring.bodies) == sent + n and [b.get("choice", 0) for b in ring.bodies[sent:]] == list(range(n))
        got = ring.bodies[-1]  # what the ring was sent is what a head can run, whatever the client wrote
        assert all(isinstance(got[k], float) and 0 <= got[k] <= 2 for k in ("temperature", "top_p"))
        assert all(type(got[k]) is int and got[k] >= (k == "max_tokens") for k in ("top_k", "max_tokens"))
        assert got["seed"] is None or 0 <= got["seed"] < 2**64
        assert got["messages"] and all(set(m) == {"role", "content"} and isinstance(m["content"], str)
                                       for m in got["messages"])
        if "text/event-stream" in resp.getheader("Content-Type", ""):
            assert data.rstrip().endswith(b"data: [DONE]")
        else:
            assert json.loads(data)["choices"][0]["message"]["content"] == "Hello, world"
        return
    assert resp.status == 400, (resp.status, data[:300])
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert len(ring.bodies) == sent  # refused before the ring

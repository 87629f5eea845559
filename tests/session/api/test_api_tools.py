"""Tool calls as the official `openai` client sees them: the head's text read in its dialect, whole or streamed.

A real ApiServer with a scripted ring behind it, which speaks as the head does for a chat with tools
(a `tool_format` event, then the reply's text in pieces); the live ring's own replies are checked in
tests/session/test_tools_ring.py. Bad tools, tool choices and messages are 400s naming the part.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from kafila.session.api.server import ApiServer
from tests.session.api_fixtures import MODEL, ScriptedRing

pytestmark = pytest.mark.fast

WEATHER: Any = {"type": "function", "function": {"name": "get_weather", "description": "The weather now.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]
DONE = {"done": {"finish_reason": "stop", "prompt_tokens": 30, "completion_tokens": 12}}


def script(fmt: str, pieces: list[str]) -> list[dict[str, Any]]:
    return [{"tool_format": fmt}, *({"delta": p, "tokens": [i]} for i, p in enumerate(pieces)), DONE]


HERMES_REPLY = ["I will look.", "\n<tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}',
                "\n</tool_call>"]


def test_a_whole_reply_holds_the_call(client: openai.OpenAI, served: tuple[ApiServer, ScriptedRing]) -> None:
    served[1].script = script("hermes", HERMES_REPLY)
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will look."
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Paris"}
    body = served[1].bodies[-1]
    assert body["tools"][0]["function"]["name"] == "get_weather" and body["tool_choice"] == "auto"


def test_a_streamed_call_reassembles_to_the_same_call(client: openai.OpenAI,
                                                      served: tuple[ApiServer, ScriptedRing]) -> None:
    served[1].script = script("hermes", HERMES_REPLY)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert content == "I will look." and "<tool" not in content
    assert [(d.index, d.function.name if d.function else None) for d in deltas] == [(0, "get_weather")]
    assert deltas[0].function is not None and deltas[0].function.arguments == '{"city":"Paris"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_reply_without_a_call_is_plain_content(client: openai.OpenAI, served: tuple[ApiServer, ScriptedRing]) -> None:
    served[1].script = script("generic", ['{"resp', 'onse": "Sunny."}'])
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    assert reply.choices[0].message.content == "Sunny." and reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


def test_tool_results_go_to_the_ring(client: openai.OpenAI, served: tuple[ApiServer, ScriptedRing]) -> None:
    messages: Any = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   parallel_tool_calls=True)
    body = served[1].bodies[-1]
    assert body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}, "id": "call_1"}]}
    assert body["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is True


BAD: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools[0].function.parameters"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "https://x.example/s"}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array", "maxItems": 10**9}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                          "function": {"arguments": "{}"}}]}]},
     "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_a_bad_tool_part_is_a_400_naming_it(client: openai.OpenAI, served: tuple[ApiServer, ScriptedRing],
                                             extra: dict[str, Any], param: str) -> None:
    before = len(served[1].bodies)
    body = {"model": MODEL, "messages": ASK, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**body)
    assert caught.value.status_code == 400 and caught.value.param == param, caught.value.message
    assert len(served[1].bodies) == before


def test_completions_refuse_tools(served: tuple[ApiServer, ScriptedRing], client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", extra_body={"tools": [WEATHER]})
    assert caught.value.param == "tools"

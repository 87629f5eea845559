"""The conversations the rendering test sends through each real template, and the replies it parses.

Shared by the test (tests/engine/test_chat_render.py) and by make_expected.py, which writes what
llama.cpp's own engine makes of them into expected.json.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
# Each template with the BOS and EOS text of its model's vocabulary.
TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": ("<|endoftext|>", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "HuggingFaceTB-SmolLM2-135M-Instruct": ("<|im_start|>", "<|im_end|>"),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
PYTHON = {"type": "function", "function": {
    "name": "python", "description": "Runs Python code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}


def _call(cid: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


ONE_CALL: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [_call("abc123XYZ", "get_weather", '{"city": "Paris", "unit": "celsius"}')]},
    {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "18 degrees, sunny"},
    {"role": "assistant", "content": "It is 18 °C and sunny in Paris."},
    {"role": "user", "content": "And the time there?"},
]
TWO_CALLS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather and time in Tokyo, please."},
    {"role": "assistant", "content": None,
     "tool_calls": [_call("000000001", "get_weather", '{"city": "Tokyo"}'),
                    _call("000000002", "get_time", '{"zone": "Asia/Tokyo"}')]},
    {"role": "tool", "tool_call_id": "000000001", "content": "rainy, 12 degrees"},
    {"role": "tool", "tool_call_id": "000000002", "content": "21:04"},
]
PLAIN: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hello there"},
]

# name -> the request: messages, tools, tool_choice, parallel_tool_calls
CASES: dict[str, dict[str, Any]] = {
    "one_call": {"messages": ONE_CALL, "tools": [WEATHER, TIME]},
    "two_calls": {"messages": TWO_CALLS, "tools": [WEATHER, TIME], "parallel_tool_calls": True},
    "first_turn": {"messages": [ONE_CALL[1]], "tools": [WEATHER]},
    "choice_none": {"messages": ONE_CALL[:2], "tools": [WEATHER], "tool_choice": "none"},
    "builtin": {"messages": [{"role": "user", "content": "Compute 2**10"}], "tools": [PYTHON, WEATHER]},
    "plain": {"messages": PLAIN, "tools": None},
}

# Replies in each dialect, parsed by llama.cpp's own parser for the format it picked for "one_call".
OUTPUTS = [
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}</tool_call>\n'
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "celsius"}}</tool_call>',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"type": "function", "name": "get_time", "parameters": {"zone": "CET"}}',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]',
    '{"tool_call": {"name": "get_weather", "arguments": {"city": "Nice"}}}',
    '{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}, "id": "call1"}]}',
    '{"response": "It is sunny."}',
    "Just text, no call.",
]


def template(name: str) -> str:
    return (HERE / f"{name}.jinja").read_text()


def inputs_digest() -> str:
    """What expected.json was made from: a test fails when cases or templates change and it is not made again."""
    data = json.dumps([TEMPLATES, CASES, OUTPUTS, {n: template(n) for n in TEMPLATES}], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()

"""A reply's tool calls, read from the model's own syntax as llama.cpp's parsers read it (common/chat.cpp).

Each dialect of formats.py has its reader; all give the reply's text (`content`) and its calls, each a
name and its arguments as a JSON string (written compactly, as llama.cpp's JSON library writes them).
A reply that does not hold well-formed calls is all content: nothing is lost, and no call is made up.
Two readings are stricter than llama.cpp's, on purpose: Llama 3.x and generic calls are recognised
only at the start of the reply (where llama.cpp's grammar triggers expect them; its Llama parser
notes the leniency as a TODO), so that text streamed before them is never taken back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from kafila.engine.chat.formats import GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL

PYTHON_TAG = "<|python_tag|>"
TOOL_CALL, TOOL_CALL_END, TOOL_CALLS = "<tool_call>", "</tool_call>", "[TOOL_CALLS]"
_HERMES_START = re.compile(r"[\n\s]*<tool_call>")
_HERMES_MIDDLE = re.compile(r"[\n\s]*</tool_call>[\n\s]*<tool_call>")
_HERMES_END = re.compile(r"[\n\s]*</tool_call>[\n\s]*$")
_BUILTIN_CALL = re.compile(r"<\|python_tag\|>([^.(]+)\.call\((.*)\)")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Call:
    """One call as the model wrote it; `id` is the model's own when it wrote one ("" otherwise)."""

    name: str
    arguments: str  # a JSON text
    id: str = ""


@dataclass(frozen=True)
class Parsed:
    content: str
    calls: tuple[Call, ...] = field(default_factory=tuple)


def compact(value: object) -> str:
    """JSON as llama.cpp's parsers write arguments: no spaces, text as it is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def parse(fmt: str, text: str) -> Parsed:
    """The content and calls of a whole reply in dialect `fmt` (formats.py); plain content for any other."""
    reader = _READERS.get(fmt)
    if reader is None:
        return Parsed(text)
    try:
        return reader(text)
    except (ValueError, KeyError, TypeError, AttributeError):  # not well-formed calls: all of it is content
        return Parsed(text)


def _json_at(text: str, pos: int) -> tuple[object, int]:
    """The JSON value starting at `pos` (after white space) and where it ends; ValueError if there is none."""
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return _DECODER.raw_decode(text, pos)


def _hermes(text: str) -> Parsed:
    start = _HERMES_START.search(text)
    if start is None:
        return Parsed(text)
    calls, pos = [], start.end()
    while pos < len(text):
        call, pos = _json_at(text, pos)
        assert isinstance(call, dict)
        calls.append(Call(str(call["name"]) if isinstance(call["name"], str) else "", compact(call["arguments"])))
        if not calls[-1].name:
            raise ValueError("a call without a name")
        middle = _HERMES_MIDDLE.search(text, pos)
        if middle is not None:
            pos = middle.end()
            continue
        if _HERMES_END.search(text, pos) is None:
            raise ValueError("no </tool_call>")
        break
    return Parsed(text[:start.start()], tuple(calls))


def _llama(text: str) -> Parsed:
    """`{"name": ..., "parameters": {...}}` calls (optionally after <|python_tag|>), one after another."""
    body = text.lstrip()
    body = body[len(PYTHON_TAG):] if body.startswith(PYTHON_TAG) else body
    calls, pos = [], 0
    while body[pos:].strip():
        call, pos = _json_at(body, pos)
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "parameters" in call
                and call.get("type", "function") == "function"):
            return Parsed(text)
        args = call["parameters"]
        calls.append(Call(call["name"], args if isinstance(args, str) else compact(args)))
    return Parsed("", tuple(calls)) if calls else Parsed(text)


def _llama_builtin(text: str) -> Parsed:
    """Llama 3.1's built-in tools, `<|python_tag|>name.call(arg=value)`; JSON calls otherwise."""
    match = _BUILTIN_CALL.fullmatch(text)
    if match is None:
        return _llama(text)
    name, raw = match.group(1), match.group(2)
    arg, _, value = raw.partition("=")
    return Parsed("", (Call(name, compact({arg: json.loads(value)})),))


def _mistral(text: str) -> Parsed:
    at = text.find(TOOL_CALLS)
    if at < 0:
        return Parsed(text)
    calls = []
    for call in json.loads(text[at + len(TOOL_CALLS):]):
        args = call["arguments"]
        ident = call.get("id", "")
        calls.append(Call(str(call["name"]), args if isinstance(args, str) else compact(args),
                          ident if isinstance(ident, str) else ""))
    return Parsed(text[:at], tuple(calls))


def _generic(text: str) -> Parsed:
    """llama.cpp's JSON for templates without tools: {"tool_call": ...}, {"tool_calls": [...]}, {"response": ...}."""
    if not text.lstrip().startswith("{"):
        return Parsed(text)
    data = json.loads(text)
    if "tool_calls" in data:
        return Parsed("", tuple(Call(str(c["name"]), compact(c["arguments"]), str(c.get("id", "")))
                                for c in data["tool_calls"]))
    if "tool_call" in data:
        call = data["tool_call"]
        return Parsed("", (Call(str(call["name"]), compact(call["arguments"])),))
    if "response" in data:
        response = data["response"]
        return Parsed(response if isinstance(response, str) else json.dumps(response, indent=2, ensure_ascii=False))
    return Parsed(text)


_READERS = {HERMES: _hermes, LLAMA_3: _llama, LLAMA_3_BUILTIN: _llama_builtin, MISTRAL: _mistral, GENERIC: _generic}

"""The grammar a request's reply must follow, from its body: llama-server's `grammar` (GBNF) and `json_schema`,
and OpenAI's `response_format` (json_object, json_schema; `text` asks for nothing).

A schema becomes GBNF by llama-cpp-python's converter (kafila.engine.grammar); the head compiles the text with
llama.cpp's grammar engine. The body is hostile input: sizes and repetition counts are bounded before anything
expands them (the converter and llama.cpp's parser write out `{m,n}` repetitions rule by rule).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kafila.engine.grammar import GrammarError, json_object_grammar, schema_grammar

MAX_GRAMMAR_CHARS = 64 * 1024  # the GBNF text and a schema as JSON (the body travels as one 4 MiB message)
MAX_REPEAT = 1024  # the most repetitions one `{m,n}` or a schema's min/max length or items may ask for
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
# bounds llama-cpp-python's converter drops (its own TODO): a reply could break them, so a schema with one is refused
_UNENFORCED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_FIELDS = ("grammar", "json_schema", "response_format")


class FieldError(ValueError):
    """A bad grammar field; `param` names the part (chat_request.py makes it a 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def request_grammar(body: dict[str, Any]) -> str | None:
    """The GBNF text the body's fields ask the reply to follow, or None; FieldError names a bad part."""
    asked = [name for name in _FIELDS if body.get(name) is not None]
    if body.get("response_format") == {"type": "text"}:  # what many clients send by default: asks for nothing
        asked.remove("response_format")
    if len(asked) > 1:
        raise FieldError(f"'{asked[0]}' and '{asked[1]}' both constrain the reply: send one of them", asked[1])
    if not asked:
        return None
    name = asked[0]
    if name == "grammar":
        return gbnf(body[name], "grammar")
    if name == "json_schema":
        return _converted(body[name], "json_schema")
    return _response_format(body[name])


def gbnf(text: Any, param: str) -> str:
    """GBNF text within the limits (llama.cpp's parser judges the rest at the head)."""
    if not isinstance(text, str) or not text.strip():
        raise FieldError(f"'{param}' must be a non-empty string of GBNF", param)
    if len(text) > MAX_GRAMMAR_CHARS:
        raise FieldError(f"'{param}' holds {len(text)} characters; at most {MAX_GRAMMAR_CHARS} are accepted", param)
    for match in _REPEAT.finditer(text):
        if any(n and int(n) > MAX_REPEAT for n in match.groups()):
            raise FieldError(f"'{param}' repeats something {match.group(0)} times; at most {MAX_REPEAT}", param)
    return text


def _response_format(value: Any) -> str:
    kinds = "'text', 'json_object' or 'json_schema'"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise FieldError(f"'response_format' must be an object whose 'type' is {kinds}", "response_format")
    if value["type"] == "json_object":  # llama-server's extension: a `schema` beside it
        schema = value.get("schema")
        return json_object_grammar() if schema is None else _converted(schema, "response_format.schema")
    if value["type"] != "json_schema":
        raise FieldError(f"'response_format.type' must be {kinds}, got {value['type'][:40]!r}", "response_format.type")
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise FieldError(f"'{where}' must be an object with 'name' and 'schema'", where)
    if not isinstance(spec.get("name", ""), str) or not isinstance(spec.get("strict", False), bool | None):
        raise FieldError(f"'{where}.name' must be a string and '{where}.strict' a boolean", where)
    return _converted(spec.get("schema"), f"{where}.schema")


def _converted(schema: Any, param: str) -> str:
    """A JSON schema's grammar; FieldError names `param` with the converter's reason when it cannot."""
    if not isinstance(schema, dict | bool):
        raise FieldError(f"'{param}' must be a JSON schema (an object)", param)
    try:
        size = len(json.dumps(schema))
    except (ValueError, RecursionError):
        raise FieldError(f"'{param}' nests too deeply", param) from None
    if size > MAX_GRAMMAR_CHARS:
        raise FieldError(f"'{param}' is {size} characters as JSON; at most {MAX_GRAMMAR_CHARS} are accepted", param)
    _bounded(schema, param)
    try:
        text = schema_grammar(schema)
    except GrammarError as exc:
        raise FieldError(f"'{param}': {exc}", param) from None
    return gbnf(text, param)


def _bounded(node: Any, param: str) -> None:
    """Refuse counts the converter would write out one by one (maxItems: 10**9 is a billion rules), and numeric
    bounds it cannot enforce."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in _COUNTS:
                count = item.get(key)
                if isinstance(count, int | float) and not isinstance(count, bool) and count > MAX_REPEAT:
                    raise FieldError(f"'{param}' asks for {key} {count}; at most {MAX_REPEAT} are supported", param)
            for key in _UNENFORCED:  # a property of that name has a schema (a dict) as its value, not a number
                if isinstance(item.get(key), int | float) and not isinstance(item[key], bool):
                    raise FieldError(f"'{param}' asks for {key} {item[key]}, which llama.cpp's JSON-schema converter "
                                     "cannot enforce; leave it out of the schema (and check the value yourself)",
                                     param)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)

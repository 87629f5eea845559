"""The grammar fields of a request body: llama-server's `grammar` and `json_schema`, OpenAI's `response_format`,
each turned into the GBNF the head follows, and every bad one a 400 naming the part."""

from __future__ import annotations

from typing import Any

import pytest

from kafila.engine.grammar import json_object_grammar, schema_grammar
from kafila.session.ring.chat_request import BadRequest, parse_chat, parse_completion, parse_request

pytestmark = pytest.mark.fast

HI = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.mark.parametrize("fields, grammar", [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, json_object_grammar()),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}},
     schema_grammar(SCHEMA)),
    ({"response_format": {"type": "json_object", "schema": SCHEMA}}, schema_grammar(SCHEMA)),
    ({"json_schema": SCHEMA}, schema_grammar(SCHEMA)),
    ({"grammar": 'root ::= "a"'}, 'root ::= "a"'),
])
def test_each_way_to_ask_gives_the_grammar_chats_and_completions_alike(fields: dict[str, Any],
                                                                       grammar: str | None) -> None:
    chat = parse_chat({"messages": HI, **fields})
    assert chat.grammar == grammar
    assert parse_completion({"prompt": "Hi", **fields}).grammar == grammar
    assert parse_request(chat.body(), internal=True).grammar == grammar  # the head reads it as sent


def test_a_property_named_like_a_bound_is_no_bound() -> None:
    schema = {"type": "object", "properties": {"minimum": {"type": "integer"}, "maximum": {"type": "string"}}}
    assert parse_request({"messages": HI, "json_schema": schema}).grammar


@pytest.mark.parametrize("fields, param, says", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema", "Unrecognized schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": "#/$defs/gone"}}}},
     "response_format.json_schema.schema", "gone"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": SCHEMA}}},
     "response_format.json_schema", "name"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({"response_format": "json"}, "response_format", "type"),
    ({"json_schema": {"type": "array", "maxItems": 10**9}}, "json_schema", "maxItems"),
    ({"json_schema": [1]}, "json_schema", "schema"),
    ({"json_schema": {"type": "array", "items": {"type": "integer", "maximum": 99}}}, "json_schema", "maximum 99"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": 0}}}}}},
     "response_format.json_schema.schema", "exclusiveMinimum"),
    ({"grammar": ""}, "grammar", "GBNF"),
    ({"grammar": 'root ::= "a"{1,100000000}'}, "grammar", "repeats"),
    ({"grammar": "x" * 70_000}, "grammar", "characters"),
    ({"grammar": 'root ::= "a"', "json_schema": SCHEMA}, "json_schema", "send one"),
])
def test_a_bad_grammar_field_is_a_400_naming_the_part(fields: dict[str, Any], param: str, says: str) -> None:
    for body in ({"messages": HI, **fields}, {"prompt": "Hi", **fields}):
        with pytest.raises(BadRequest, match=says) as err:
            parse_request(body)
        assert err.value.param == param and err.value.event()["status"] == 400

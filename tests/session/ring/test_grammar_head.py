"""Grammar-constrained sampling at the head, on real llama.cpp (a ring of one): a greedy reply constrained by a
JSON schema is llama-cpp-python's own grammar-constrained greedy completion of the same prompt, with or without
speculation; sampled replies always parse and validate; a resumed reply goes on under the grammar; a grammar
llama.cpp cannot compile is a 400 naming it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kafila.session.ring.head import Head
from tests.conftest import reference_llama
from tests.session.solo_head import N_CTX

pytestmark = pytest.mark.fast

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "maxItems": 3,
                                                         "items": {"type": "string", "maxLength": 12}}},
          "required": ["name", "age", "languages"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                         "country": {"enum": ["France", "Italy", "Spain", "Other"]},
                                         "population": {"type": "number"}, "capital": {"type": "boolean"}},
        "required": ["city", "country", "population", "capital"]}
LIST = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5}
ASK = {json.dumps(PERSON): "Describe a famous programmer as JSON.",
       json.dumps(CITY): "Give a European city as JSON.",
       json.dumps(LIST): "List a few small numbers as a JSON array."}
MAX_TOKENS = 80


async def reply(h: Head, body: dict[str, Any]) -> tuple[list[int], str, dict[str, Any]]:
    evts = [e async for e in h.chat(body)]
    assert "done" in evts[-1], evts[-1]
    return ([t for e in evts for t in e.get("tokens", [])], "".join(e.get("delta", "") for e in evts),
            evts[-1]["done"])


def chat(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": ASK[json.dumps(schema)]}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "json_schema": schema, **extra}


def llama_cpp_constrained(model: Path, prompt: list[int], schema: dict[str, Any]) -> str:
    """Ground truth: llama-cpp-python's greedy completion of `prompt` under its grammar for `schema`."""
    from llama_cpp import LlamaGrammar

    with reference_llama(model, N_CTX) as m:
        out = m.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0,
                                  grammar=LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False))
    assert out["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    return str(out["choices"][0]["text"])  # type: ignore[index]


@pytest.mark.parametrize("schema", [PERSON, CITY])
async def test_a_greedy_reply_under_a_schema_is_llama_cpps_constrained_completion(head: Head, smollm: Path,
                                                                                  schema: dict[str, Any]) -> None:
    prompt = head.vocab.chat_tokens([{"role": "user", "content": ASK[json.dumps(schema)]}])
    truth = await asyncio.to_thread(llama_cpp_constrained, smollm, prompt, schema)
    tokens, text, done = await reply(head, chat(schema, speculate="off"))
    assert text == truth and done["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), schema)
    assert (await reply(head, chat(schema, speculate="lookup")))[:2] == (tokens, text)


@pytest.mark.parametrize("schema", [PERSON, CITY, LIST])
async def test_sampled_replies_always_parse_and_validate(head: Head, schema: dict[str, Any]) -> None:
    for seed, speculate in ((1, "lookup"), (2, "off")):
        _, text, done = await reply(head, chat(schema, temperature=1.0, seed=seed, speculate=speculate,
                                               max_tokens=120))
        assert done["finish_reason"] == "stop", text
        jsonschema.validate(json.loads(text), schema)


async def test_a_resumed_reply_goes_on_under_the_grammar(head: Head) -> None:
    body = chat(PERSON, cache_prompt=False)
    whole, _, _ = await reply(head, body)
    cut = len(whole) // 2
    again, _, _ = await reply(head, {**body, "resume": whole[:cut], "max_tokens": MAX_TOKENS - cut})
    assert again == whole[cut:]


async def test_json_object_and_a_raw_grammar_shape_the_reply(head: Head) -> None:
    ask = {"messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 40, "temperature": 0}
    assert isinstance(json.loads((await reply(head, {**ask, "response_format": {"type": "json_object"}}))[1]), dict)
    assert (await reply(head, {**ask, "grammar": 'root ::= "Yes, " [a-z ]+ "."'}))[1].startswith("Yes, ")


@pytest.mark.parametrize("grammar", ["root ::= undefined-rule", 'root ::= root "a"'])
async def test_a_grammar_llama_cpp_cannot_compile_is_a_400_naming_it(head: Head, grammar: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "grammar": grammar}
    evts = [e async for e in head.chat(body)]
    assert evts[-1]["status"] == 400 and evts[-1]["param"] == "grammar" and "compile" in evts[-1]["error"]

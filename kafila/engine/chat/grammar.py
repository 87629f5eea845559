"""The grammar that makes a reply a call (`tool_choice: required` or a named function), in the model's dialect.

The call's JSON (its name fixed, its arguments the function's JSON schema) is turned into GBNF by
llama-cpp-python's JSON-schema converter, the one llama.cpp's server uses (no converter of our own);
around it, the dialect's markers, as llama.cpp's handlers write them (common/chat.cpp): Hermes/Qwen's
`<tool_call>…</tool_call>`, Mistral's `[TOOL_CALLS][…]`, Llama 3.x's bare `{"name", "parameters"}`, and
the generic form's `{"tool_call": …}` (`{"tool_calls": […]}` when calls may go in parallel).
"""

from __future__ import annotations

from llama_cpp.llama_grammar import SchemaConverter

from kafila.engine.chat.formats import GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL
from kafila.engine.chat.template import Json


class SchemaError(ValueError):
    """A function's parameters the converter cannot turn into a grammar."""


def call_schema(fmt: str, function: Json, parallel: bool = False) -> Json:
    """The JSON one call is written as in dialect `fmt`."""
    name = {"type": "string", "const": function["name"]}
    params = function.get("parameters") or {"type": "object"}
    if fmt in (LLAMA_3, LLAMA_3_BUILTIN):
        return {"type": "object", "properties": {"name": name, "parameters": params},
                "required": ["name", "parameters"]}
    schema: Json = {"type": "object", "properties": {"name": name, "arguments": params},
                    "required": ["name", "arguments"]}
    if fmt == MISTRAL:  # Nemo's template expects a 9-character alphanumeric id
        schema["properties"]["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
        schema["required"].append("id")
    elif fmt == GENERIC and parallel:
        schema["properties"]["id"] = {"type": "string", "minLength": 4}
        schema["required"].append("id")
    return schema


def _one_of(schemas: list[Json]) -> Json:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def tool_grammar(fmt: str, functions: list[Json], parallel: bool = False, response: bool = False) -> str:
    """GBNF whose every sentence is one call (several when `parallel`) of one of `functions`; with `response`
    (the generic form only), or `{"response": "..."}`, as llama.cpp's generic handler allows under `auto`."""
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    calls = [call_schema(fmt, f, parallel) for f in functions]
    try:
        if fmt == GENERIC:
            key, value = (("tool_calls", {"type": "array", "items": _one_of(calls), "minItems": 1}) if parallel
                          else ("tool_call", _one_of(calls)))
            schema: Json = {"type": "object", "properties": {key: value}, "required": [key]}
            if response:
                schema = {"anyOf": [schema, {"type": "object", "properties": {"response": {"type": "string"}},
                                             "required": ["response"]}]}
            converter.visit(converter.resolve_refs(schema, "tools"), "")
        elif fmt == MISTRAL:
            array: Json = {"type": "array", "items": _one_of(calls), "minItems": 1}
            if not parallel:
                array["maxItems"] = 1
            rule = converter.visit(converter.resolve_refs(array, "tools"), "tool-calls")
            converter._add_rule("root", f'"[TOOL_CALLS]" {rule}')
        else:
            rule = converter.visit(converter.resolve_refs(_one_of(calls), "tools"), "tool-call")
            if fmt == HERMES:
                one = f'"<tool_call>" space {rule} "</tool_call>" space'
                converter._add_rule("root", f"({one})+" if parallel else one)
            else:
                converter._add_rule("root", rule)
    except (ValueError, KeyError, TypeError, AssertionError, NotImplementedError) as exc:
        raise SchemaError(str(exc) or type(exc).__name__) from None
    return converter.format_grammar()


def schema_problem(parameters: Json) -> str | None:
    """Why the converter cannot make a grammar of a function's `parameters` (None: it can)."""
    try:
        tool_grammar(GENERIC, [{"name": "f", "parameters": parameters}])
    except SchemaError as exc:
        return str(exc)
    return None

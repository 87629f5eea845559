"""Chats with tools rendered and read back as llama.cpp's own engine does, byte for byte.

The ground truth is tests/engine/chat_templates/expected.json: what llama.cpp's server code
(common/chat.cpp and minja, compiled into a small renderer by make_expected.py) renders for each real
template and case, and what its parsers make of sample replies. Kafila renders with Jinja2, a different
engine: the two agree only where Kafila does what llama.cpp does (its probing of the template, its
polyfills, its generic system prompt, its tojson).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kafila.engine.chat.formats import CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL, render
from kafila.engine.chat.parse import parse
from kafila.engine.chat.template import ChatTemplate, TemplateError, dump
from tests.engine.chat_templates.cases import CASES, HERE, OUTPUTS, TEMPLATES, inputs_digest, template

pytestmark = pytest.mark.fast

EXPECTED = json.loads((HERE / "expected.json").read_text())
FORMATS = {"Content-only": CONTENT_ONLY, "Generic": GENERIC, "Hermes 2 Pro": HERMES, "Llama 3.x": LLAMA_3,
           "Llama 3.x with builtin tools": LLAMA_3_BUILTIN, "Mistral Nemo": MISTRAL}


@pytest.fixture(scope="module")
def templates() -> dict[str, ChatTemplate]:
    return {name: ChatTemplate(template(name), bos, eos) for name, (bos, eos) in TEMPLATES.items()}


def test_the_expected_outputs_were_made_from_these_cases() -> None:
    assert EXPECTED["inputs"] == inputs_digest(), "cases or templates changed: run make_expected.py again"
    assert len(EXPECTED["llama.cpp"]) == 40


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("case", CASES)
def test_the_prompt_is_llama_cpps_byte_for_byte(templates: dict[str, ChatTemplate], name: str, case: str) -> None:
    truth, body = EXPECTED["results"][f"{name}/{case}"], CASES[case]
    if "error" in truth:  # llama.cpp refuses this conversation (Llama 3.1 takes one call at a time): so does Kafila
        with pytest.raises(TemplateError):
            render(templates[name], body["messages"], body.get("tools"), body.get("tool_choice", "auto"))
        return
    prompt = render(templates[name], body["messages"], body.get("tools"), body.get("tool_choice", "auto"))
    assert prompt.text == truth["prompt"]
    assert prompt.format == FORMATS[truth["format"]]


def test_the_real_templates_cover_every_dialect() -> None:
    seen = {r["format"] for r in EXPECTED["results"].values() if "format" in r}
    assert {FORMATS[f] for f in seen} == {CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL}


def _mine(fmt: str, text: str) -> dict[str, Any]:
    got = parse(fmt, text)
    return {"content": got.content, "tool_calls": [{"name": c.name, "arguments": c.arguments, "id": c.id}
                                                   for c in got.calls]}


@pytest.mark.parametrize("fmt_name", sorted(FORMATS))
def test_replies_are_read_as_llama_cpp_reads_them(fmt_name: str) -> None:
    truth = next(r for r in EXPECTED["results"].values() if r.get("format") == fmt_name)
    fmt = FORMATS[fmt_name]
    for text, want in zip(OUTPUTS, truth["parsed"], strict=True):
        mine = _mine(fmt, text)
        if "error" in want:  # llama.cpp's parser throws: Kafila keeps the reply as its content
            assert mine == {"content": text, "tool_calls": []}, text
        elif fmt == GENERIC and not want["tool_calls"] and want["content"] == "" and text.startswith("{"):
            # JSON that is neither a call nor a response: llama.cpp drops it, Kafila keeps it as content
            assert mine == {"content": text, "tool_calls": []}, text
        else:
            assert mine == want, text


def test_generic_calls_and_a_response() -> None:
    assert _mine(GENERIC, OUTPUTS[5])["tool_calls"] == [{"name": "get_weather", "arguments": '{"city":"Nice"}',
                                                         "id": ""}]
    assert _mine(GENERIC, OUTPUTS[7]) == {"content": "It is sunny.", "tool_calls": []}


def test_tojson_writes_json_as_minja_does() -> None:
    value = {"b": [1, 2.5, "é", True, None], "a": {}, "c": []}
    assert dump(value) == '{"b": [1, 2.5, "é", true, null], "a": {}, "c": []}'
    assert dump({"x": [1]}, 2) == '{\n  "x": [\n    1\n  ]\n}'
    assert dump([], 2) == "[\n  \n]"  # minja opens a line even in an empty one


def test_a_template_without_a_system_role_gets_it_folded_into_the_user_turn() -> None:
    tmpl = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
                        "{% endif %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    assert not tmpl.caps.system_role
    out = tmpl.apply([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert out == "[user] Be brief.\nHi\n"

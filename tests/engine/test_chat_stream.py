"""Reading calls out of a reply: each dialect's reader, and the streaming splitter against it.

The property: however the reply's text is cut into chunks, the splitter gives the calls the whole
reply has, and the content it streams plus what it gives at the end is the whole reply's content.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.engine.chat.formats import CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL
from kafila.engine.chat.parse import Call, parse
from kafila.engine.chat.stream import CallSplitter

pytestmark = pytest.mark.fast

FORMATS = [CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL]


def test_hermes_calls_after_text() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "g", ' \
           '"arguments": {}}</tool_call>'
    assert parse(HERMES, text).content == "Sure."
    assert parse(HERMES, text).calls == (Call("f", '{"x":1}'), Call("g", "{}"))


def test_a_malformed_call_is_content() -> None:
    for text in ['<tool_call>{"name": "f"}</tool_call>', '<tool_call>{"name": "f", "arguments": {}}',
                 '<tool_call>{"name": "f", "arguments": {}}</tool_call> and more']:
        assert parse(HERMES, text).calls == () and parse(HERMES, text).content == text


def test_llama_json_calls_and_the_python_tag() -> None:
    assert parse(LLAMA_3, '{"name": "f", "parameters": {"a": "b"}}').calls == (Call("f", '{"a":"b"}'),)
    assert parse(LLAMA_3, '<|python_tag|>{"type": "function", "name": "f", "parameters": {}}').calls == (
        Call("f", "{}"),)
    assert parse(LLAMA_3, 'I think {"name": "f", "parameters": {}}').calls == ()  # only at the start
    assert parse(LLAMA_3_BUILTIN, '<|python_tag|>python.call(code="print(1)")').calls == (
        Call("python", '{"code":"print(1)"}'),)


def test_mistral_calls_keep_their_ids() -> None:
    got = parse(MISTRAL, 'ok[TOOL_CALLS][{"name": "f", "arguments": {"q": 1}, "id": "abcDEF123"}]')
    assert got.content == "ok" and got.calls == (Call("f", '{"q":1}', "abcDEF123"),)


def test_generic_forms() -> None:
    assert parse(GENERIC, '{"tool_calls": [{"name": "f", "arguments": {"a": 1}, "id": "c1"}]}').calls == (
        Call("f", '{"a":1}', "c1"),)
    assert parse(GENERIC, '{"tool_call": {"name": "f", "arguments": {}}}').calls == (Call("f", "{}"),)
    assert parse(GENERIC, '{"response": "hi"}').content == "hi"
    assert parse(GENERIC, "plain words").content == "plain words"


def _call(name: str, args: dict[str, object]) -> dict[str, object]:
    return {"name": name, "arguments": args}


words = st.text(alphabet=st.sampled_from(list("ab {}<>[]\n\"_|T")), max_size=12)
args = st.dictionaries(st.sampled_from(["x", "city", "é"]), st.integers(-5, 5) | st.text(max_size=4), max_size=2)
names = st.sampled_from(["f", "get_weather"])


@st.composite
def replies(draw: st.DrawFn) -> tuple[str, str]:
    """A reply in some dialect: text, calls in its syntax (some broken), pieces of markers, white space."""
    fmt = draw(st.sampled_from(FORMATS))
    calls = [(draw(names), draw(args)) for _ in range(draw(st.integers(0, 2)))]
    ws = draw(st.sampled_from(["", " ", "\n", " \n "]))
    lead = draw(words)
    if fmt == HERMES:
        body = "".join(f'{ws}<tool_call>{ws}{json.dumps(_call(n, a))}{ws}</tool_call>' for n, a in calls)
    elif fmt == MISTRAL:
        body = "[TOOL_CALLS]" + json.dumps([{**_call(n, a), "id": "abcdefghi"} for n, a in calls]) if calls else ""
    elif fmt in (LLAMA_3, LLAMA_3_BUILTIN):
        lead = draw(st.sampled_from(["", ws, "<|python_tag|>", lead]))
        body = ws.join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    elif fmt == GENERIC:
        lead = draw(st.sampled_from(["", ws, lead]))
        body = json.dumps({"tool_calls": [_call(n, a) for n, a in calls]} if calls
                          else {"response": draw(words)})
    else:
        body = "".join(json.dumps(_call(n, a)) for n, a in calls)
    text = lead + body + draw(st.sampled_from(["", "", ws, draw(words)]))
    if draw(st.booleans()):  # cut it short: a reply that ended at max_tokens
        text = text[:draw(st.integers(0, len(text)))]
    return fmt, text


@settings(max_examples=600, deadline=None)
@given(replies(), st.data())
def test_any_split_gives_the_whole_replys_calls_and_content(reply: tuple[str, str], data: st.DataObject) -> None:
    fmt, text = reply
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    splitter = CallSplitter(fmt)
    streamed = "".join(splitter.push(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True))
    rest = splitter.finish()
    whole = parse(fmt, text)
    assert rest.calls == whole.calls
    assert streamed + rest.content == whole.content


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([HERMES, MISTRAL]), words, names, args)
def test_text_before_a_call_streams_before_it(fmt: str, lead: str, name: str, arguments: dict[str, object]) -> None:
    call = (f"<tool_call>{json.dumps(_call(name, arguments))}</tool_call>" if fmt == HERMES
            else "[TOOL_CALLS]" + json.dumps([_call(name, arguments)]))
    splitter = CallSplitter(fmt)
    streamed = "".join(splitter.push(ch) for ch in lead + call)
    whole = parse(fmt, lead + call)
    if whole.calls:  # what came before the call was sent before it, as content
        assert streamed == whole.content

"""Tool calls through a real ring: three members as separate processes, the official `openai` client.

SmolLM2-135M knows no tools: its template gets llama.cpp's generic system prompt, and a reply that must
call (`tool_choice: required`, or a named function) is held to the call's JSON by the grammar. Every
call's arguments validate against the function's schema; a streamed call reassembles to the whole
reply's; a conversation with a tool's result goes on; and the greedy forced call is the one
llama-cpp-python's own grammar-constrained completion gives for the same prompt and grammar.

The host runs with `--chat-template`: SmolLM2's own template with another default system prompt, which the
head must render with in place of the model's (the prompt's length tells which one it used).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from kafila.engine.chat.formats import GENERIC, render
from kafila.engine.chat.grammar import tool_grammar
from kafila.engine.chat.parse import parse
from kafila.engine.chat.template import ChatTemplate
from kafila.model.gguf_file import GGUFFile
from kafila.session.api.token import read_token
from tests.session.cluster import REPLY_TIMEOUT_S, Cluster
from tests.session.tool_specs import ADD, WEATHER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * REPLY_TIMEOUT_S)]  # two replies on a loaded machine

ASK: Any = [{"role": "user", "content": "What is the weather like in Paris today?"}]
MAX_TOKENS = 60
OWN_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
HOSTS_PROMPT = "You are a careful assistant of the Kafila ring. You call the tools you are given when they help."


def hosts_template(smollm: Path) -> str:
    """The template the host's --chat-template gives: SmolLM2's own with another default system prompt."""
    own = GGUFFile(smollm).get("tokenizer.chat_template")
    assert OWN_PROMPT in own
    return own.replace(OWN_PROMPT, HOSTS_PROMPT)


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory, smollm: Path) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("tools")
    (tmp / "template.jinja").write_text(hosts_template(smollm))
    cluster = Cluster(tmp, [("ada", []), ("bo", []), ("cy", [])],
                      host_args=["--chat-template", str(tmp / "template.jinja")])
    try:
        cluster.wait_phase({"admitted"})
        yield cluster
    finally:
        assert cluster.stop() == [], "processes hung on shutdown"


@pytest.fixture(scope="module")
def client(ring: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=ring.url + "/v1", api_key=read_token(ring.url), max_retries=0,
                       timeout=REPLY_TIMEOUT_S) as c:
        yield c


def _call(reply: Any, tool: Any) -> Any:
    """The reply's one call, checked: finish_reason, id, name, and arguments valid under the schema."""
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    return call


def test_required_returns_a_valid_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, ADD], tool_choice="required",
                                           max_tokens=MAX_TOKENS, temperature=0)
    call = _call(reply, WEATHER if reply.choices[0].message.tool_calls[0].function.name == "get_weather" else ADD)
    assert reply.usage is not None and reply.usage.completion_tokens < MAX_TOKENS  # the call closed itself
    assert call.function.arguments


def test_a_named_function_is_called(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, ADD],
                                           tool_choice={"type": "function", "function": {"name": "add"}},
                                           max_tokens=MAX_TOKENS, temperature=0)
    _call(reply, ADD)


def test_a_streamed_call_reassembles_to_the_whole_replys(client: openai.OpenAI) -> None:
    kwargs: Any = {"model": "m", "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                   "max_tokens": MAX_TOKENS, "temperature": 0}
    whole = _call(client.chat.completions.create(**kwargs), WEATHER)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or "" if delta.function else ""
            entry["arguments"] += delta.function.arguments or "" if delta.function else ""
    assert calls == {0: {"name": "get_weather", "arguments": whole.function.arguments}}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_conversation_with_a_tool_result_goes_on(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=MAX_TOKENS, temperature=0)
    call = _call(first, WEATHER)
    messages: Any = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], tool_choice="none",
                                           max_tokens=24, temperature=0)
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None
    assert reply.usage is not None and reply.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_the_forced_call_is_llama_cpps_grammar_constrained_completion(client: openai.OpenAI, smollm: Path) -> None:
    from llama_cpp import Llama, LlamaGrammar

    from kafila.engine.llama_lib import llama

    reply = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=MAX_TOKENS, temperature=0)
    call = _call(reply, WEATHER)
    llama()
    model = Llama(str(smollm), n_ctx=1024, verbose=False)
    try:
        bos = model.detokenize([model.token_bos()], special=True).decode()
        eos = model.detokenize([model.token_eos()], special=True).decode()
        template = ChatTemplate(hosts_template(smollm), bos, eos)
        prompt = render(template, ASK, [WEATHER], "required")
        tokens = [model.token_bos()] * prompt.bos + model.tokenize(prompt.text.encode(), add_bos=False, special=True)
        grammar = LlamaGrammar.from_string(tool_grammar(GENERIC, [WEATHER["function"]]), verbose=False)
        out: Any = model.create_completion(tokens, max_tokens=MAX_TOKENS, temperature=0, grammar=grammar)
    finally:
        model.close()
    truth = parse(GENERIC, out["choices"][0]["text"])
    assert [(c.name, c.arguments) for c in truth.calls] == [(call.function.name, call.function.arguments)]
    assert reply.usage is not None and reply.usage.completion_tokens == out["usage"]["completion_tokens"]


def test_the_hosts_chat_template_renders_the_prompt(client: openai.OpenAI, smollm: Path) -> None:
    reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=2, temperature=0)
    hosts = ChatTemplate(hosts_template(smollm)).apply(ASK)
    own = ChatTemplate(GGUFFile(smollm).get("tokenizer.chat_template")).apply(ASK)
    assert HOSTS_PROMPT in hosts and OWN_PROMPT in own
    assert reply.usage is not None and reply.usage.prompt_tokens == _tokens(smollm, hosts) != _tokens(smollm, own)


def _tokens(smollm: Path, text: str) -> int:
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()
    model = Llama(str(smollm), n_ctx=64, verbose=False, vocab_only=True)
    try:
        return len(model.tokenize(text.encode(), add_bos=False, special=True))
    finally:
        model.close()

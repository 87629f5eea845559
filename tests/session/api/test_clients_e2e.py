"""Client acceptance: the official `openai` client and LangChain's `ChatOpenAI` against a ring of three members
(separate processes, the API on the coordinating host): every sampling field is accepted and honoured, checked by
what it must do to the reply (a stop string never shows, a banned token never comes, n gives n different choices,
a seed repeats, top_p near 0 is greedy, penalties break a repetition, usage counts what came), and both clients
get the same reply for the same fields; structured output through `parse` and `with_structured_output` gives the
pydantic object; `tool_choice` required and a named function give a valid call through both clients (LangChain's
`bind_tools`), whole and streamed; a completion's top log-probabilities are llama-cpp-python's. One ring for every
case."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from kafila.session.launch.demo import SHARED_MACHINE_ENV
from tests.session.cluster import REPLY_TIMEOUT_S, Cluster
from tests.session.tool_specs import ADD, WEATHER
from tests.shared_probe import shared_probe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * REPLY_TIMEOUT_S)]

MODEL = "SmolLM2"
CAPITAL = "What is the capital of France? Answer in one sentence."
OPEN = "Write one sentence about the sea."  # many likely replies: sampling shows
REPEAT = "Write the word 'bee' twenty times, separated by spaces."
FRESH = {"cache_prompt": False}  # computed afresh: the same numbers every time (a reused cache moves them a little)
TOKENS = 10
SEED = 4242


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    one = ["--threads", "1"]  # three members spinning on every core of a small machine slow each other many times
    tmp = tmp_path_factory.mktemp("ring")
    shared_probe(tmp / "cache", 1)  # the members' one-thread probe, measured once for all tests
    members = [("ada", one), ("bo", one), ("cy", one)]
    with Cluster(tmp, members, member_env={n: SHARED_MACHINE_ENV for n, _ in members}) as cluster:
        cluster.wait_phase({"admitted"})
        yield cluster


@pytest.fixture(scope="module")
def client(ring: Cluster) -> Iterator[openai.OpenAI]:
    token = ring.headers()["Authorization"].removeprefix("Bearer ")
    with openai.OpenAI(base_url=ring.url + "/v1", api_key=token, max_retries=0, timeout=REPLY_TIMEOUT_S) as c:
        yield c


def chat_model(ring: Cluster, **fields: Any) -> ChatOpenAI:
    token = ring.headers()["Authorization"].removeprefix("Bearer ")
    return ChatOpenAI(model=MODEL, base_url=ring.url + "/v1", api_key=token, max_retries=0,  # type: ignore[arg-type]
                      timeout=REPLY_TIMEOUT_S, extra_body=FRESH, **fields)


def ask(client: openai.OpenAI, content: str = CAPITAL, **fields: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          **{"max_tokens": TOKENS, "temperature": 0, "extra_body": FRESH, **fields})


def token_id(smollm: Path, piece: str) -> int:
    """The id of the one token `piece` is (from the model file's own vocabulary, not Kafila's code)."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()
    model = Llama(str(smollm), vocab_only=True, verbose=False)
    try:
        ids = model.tokenize(piece.encode(), add_bos=False, special=False)
    finally:
        model.close()
    assert len(ids) == 1, (piece, ids)
    return int(ids[0])


def test_models_give_the_context_length(client: openai.OpenAI) -> None:
    model: Any = next(iter(client.models.list()))
    assert model.max_model_len == model.context_length == 512  # the session's --context (cluster.py)
    assert model.meta == {"n_ctx": 512, "n_ctx_train": 8192, "n_seq_max": 4}  # SmolLM2 was trained on 8192


def test_max_tokens_stop_and_usage(client: openai.OpenAI, ring: Cluster) -> None:
    whole = ask(client, max_tokens=6)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 6
    text = ask(client).choices[0].message.content
    stop = text[6:10]
    cut = ask(client, stop=[stop, "zzz"])
    assert cut.choices[0].message.content == text[:6] and cut.choices[0].finish_reason == "stop"
    chunks = list(ask(client, stop=stop, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[:6]
    assert chunks[-1].usage == cut.usage and cut.usage.completion_tokens > 0
    lc = chat_model(ring, temperature=0, max_tokens=TOKENS).invoke([HumanMessage(CAPITAL)], stop=[stop])
    assert lc.content == text[:6] and lc.response_metadata["finish_reason"] == "stop"
    assert lc.usage_metadata is not None and lc.usage_metadata["output_tokens"] == cut.usage.completion_tokens
    streamed: Any = None
    for piece in chat_model(ring, temperature=0, max_tokens=TOKENS, stream_usage=True).stream([HumanMessage(CAPITAL)]):
        streamed = piece if streamed is None else streamed + piece
    assert isinstance(streamed, AIMessageChunk) and streamed.content == text
    assert streamed.usage_metadata is not None and streamed.usage_metadata["output_tokens"] > 0


def test_seed_temperature_and_top_p(client: openai.OpenAI, ring: Cluster) -> None:
    sampled = {"temperature": 0.9, "seed": SEED, "max_tokens": TOKENS}
    first = ask(client, OPEN, **sampled).choices[0].message.content
    assert ask(client, OPEN, **sampled).choices[0].message.content == first
    assert ask(client, OPEN, **{**sampled, "seed": SEED + 1}).choices[0].message.content != first
    lc = chat_model(ring, **sampled)
    assert lc.invoke([HumanMessage(OPEN)]).content == first  # the same fields: the same reply
    greedy = ask(client, OPEN).choices[0].message.content
    assert greedy != first  # sampling shows here ...
    assert ask(client, OPEN, temperature=1.5, top_p=1e-9).choices[0].message.content == greedy  # ... top_p cuts it
    assert chat_model(ring, temperature=1.5, top_p=1e-9, max_tokens=TOKENS).invoke(
        [HumanMessage(OPEN)]).content == greedy


def test_penalties_break_a_repetition(client: openai.OpenAI, ring: Cluster) -> None:
    def most(text: str) -> int:  # how often the repeated word comes (with or without spaces between)
        return text.lower().count("bee")

    plain = ask(client, REPEAT, max_tokens=16).choices[0].message.content
    for fields in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalised = ask(client, REPEAT, max_tokens=16, **fields).choices[0].message.content
        assert most(penalised) < most(plain), (fields, plain, penalised)
        lc = chat_model(ring, temperature=0, max_tokens=16, **fields).invoke([HumanMessage(REPEAT)])
        assert lc.content == penalised


def test_logit_bias_bans_a_token_and_logprobs_show_it(client: openai.OpenAI, ring: Cluster, smollm: Path) -> None:
    greedy = ask(client, logprobs=True, top_logprobs=3)
    content = greedy.choices[0].logprobs.content
    assert len(content) == greedy.usage.completion_tokens and "".join(c.token for c in content) == \
        greedy.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token and c.logprob <= 0 for c in content)
    first = content[0].token
    banned = {str(token_id(smollm, first)): -100}
    biased = ask(client, logit_bias=banned, logprobs=True)
    assert first not in [c.token for c in biased.choices[0].logprobs.content]
    lc = chat_model(ring, temperature=0, max_tokens=TOKENS, logit_bias=banned, logprobs=True,
                    top_logprobs=2).invoke([HumanMessage(CAPITAL)])
    assert lc.content == biased.choices[0].message.content
    tokens = [c["token"] for c in lc.response_metadata["logprobs"]["content"]]
    assert first not in tokens and all(len(c["top_logprobs"]) == 2
                                       for c in lc.response_metadata["logprobs"]["content"])


def test_n_choices(client: openai.OpenAI, ring: Cluster) -> None:
    sampled = {"temperature": 0.9, "seed": SEED, "max_tokens": TOKENS}
    reply = ask(client, OPEN, n=3, **sampled)
    texts = [c.message.content for c in reply.choices]
    assert [c.index for c in reply.choices] == [0, 1, 2] and len(set(texts)) == 3, texts
    assert texts[0] == ask(client, OPEN, **sampled).choices[0].message.content  # choice 0: the request's own reply
    assert reply.usage.completion_tokens == sum(c["completion_tokens"]  # every choice's tokens, the prompt once
                                                for c in reply.model_extra["kafila"]["choices"])
    result = chat_model(ring, n=3, **sampled).generate([[HumanMessage(OPEN)]])
    assert [g.text for g in result.generations[0]] == texts
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, n=5)  # the host's --concurrency is 4
    assert err.value.body["param"] == "n"  # type: ignore[index]


class City(BaseModel):
    name: str
    country: str


def test_structured_output_as_pydantic_objects(client: openai.OpenAI, ring: Cluster) -> None:
    question = [{"role": "user", "content": "Name one city in Italy, as JSON with its name and country."}]
    parsed = client.chat.completions.parse(model=MODEL, messages=question, response_format=City,  # type: ignore[arg-type]
                                           max_tokens=96, temperature=0, extra_body=FRESH).choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.name and parsed.country
    structured = chat_model(ring, temperature=0, max_tokens=96).with_structured_output(City)
    assert structured.invoke([HumanMessage(question[0]["content"])]) == parsed


WEATHER_QUESTION = "What is the weather like in Paris today?"
CALL_TOKENS = 60


@pytest.mark.parametrize("choice", ["required", "add"])
def test_forced_tool_calls_through_both_clients(client: openai.OpenAI, ring: Cluster, choice: str) -> None:
    tool_choice: Any = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    reply = ask(client, WEATHER_QUESTION, tools=[WEATHER, ADD], tool_choice=tool_choice, max_tokens=CALL_TOKENS)
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls
    tool = next(t for t in (WEATHER, ADD) if t["function"]["name"] == call.function.name)
    assert choice == "required" or call.function.name == choice
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    streamed: dict[int, dict[str, str]] = {}  # the openai client's deltas, reassembled by index
    for chunk in ask(client, WEATHER_QUESTION, tools=[WEATHER, ADD], tool_choice=tool_choice,
                     max_tokens=CALL_TOKENS, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            part = streamed.setdefault(d.index, {"name": "", "arguments": ""})
            part["name"] += d.function.name or ""
            part["arguments"] += d.function.arguments or ""
    assert list(streamed.values()) == [{"name": call.function.name, "arguments": call.function.arguments}]
    lc = chat_model(ring, temperature=0, max_tokens=CALL_TOKENS).bind_tools([WEATHER, ADD], tool_choice=choice)
    whole = lc.invoke([HumanMessage(WEATHER_QUESTION)])
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [(call.function.name, args)]
    pieces: Any = None
    for piece in lc.stream([HumanMessage(WEATHER_QUESTION)]):
        pieces = piece if pieces is None else pieces + piece
    assert isinstance(pieces, AIMessageChunk)
    assert [(c["name"], c["args"]) for c in pieces.tool_calls] == [(call.function.name, args)]


def llama_cpp_completion_logprobs(smollm: Path, prompt: str, tokens: int, k: int) -> dict[str, Any]:
    """llama-cpp-python's own greedy completion of `prompt` with its top-`k` log-probabilities (ground truth)."""
    from tests.conftest import reference_llama

    with reference_llama(smollm, 512, logits_all=True) as model:
        out: Any = model.create_completion(prompt, max_tokens=tokens, temperature=0, logprobs=k)
    return dict(out["choices"][0])


def test_completion_top_logprobs_are_llama_cpps(client: openai.OpenAI, smollm: Path) -> None:
    prompt, k = "The capital of France is", 5
    ours = client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0, logprobs=k,
                                     extra_body=FRESH).choices[0]
    truth = llama_cpp_completion_logprobs(smollm, prompt, TOKENS, k)
    assert ours.text == truth["text"]
    assert ours.logprobs is not None and ours.logprobs.tokens == truth["logprobs"]["tokens"]
    worst = max(abs(a - b) for a, b in zip(ours.logprobs.token_logprobs, truth["logprobs"]["token_logprobs"],
                                           strict=True))
    assert ours.logprobs.top_logprobs is not None
    for mine, theirs in zip(ours.logprobs.top_logprobs, truth["logprobs"]["top_logprobs"], strict=True):
        assert set(mine) == set(theirs), (mine, theirs)
        worst = max(worst, *(abs(mine[t] - theirs[t]) for t in mine))
    print(f"max |logprob - llama-cpp-python's| = {worst:.2e}")
    assert worst < 1e-4

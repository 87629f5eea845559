"""`n` choices, `seed` and `usage` as the official `openai` package sees them, from a real API server in front of a
real head (the whole SmolLM2 as its one stage, three slots): each choice is its own sequence whose prompt is forked
from the first one's (unless cache_prompt is false), seeded apart from the others and the same twice; streamed
chunks carry each choice's index and a last chunk the whole request's usage; more choices than the session's slots
are a 400 naming `n`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from kafila.model.stage_cache import StageCache
from kafila.session.api.server import ApiServer
from tests.session.api_fixtures import MODEL
from tests.session.solo_head import served_head

pytestmark = pytest.mark.fast

HI: Any = [{"role": "user", "content": "Write one sentence about the sea."}]
SLOTS = 3
# computed afresh: the same numbers each time (a reused cache computed in other chunks moves them a little)
SAMPLED: dict[str, Any] = {"temperature": 0.8, "seed": 5, "max_tokens": 8, "extra_body": {"cache_prompt": False}}


@pytest.fixture(scope="module")
def served(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An ApiServer whose ring is a running solo head of three slots, on its own event loop in a thread."""
    with served_head(smollm, StageCache(tmp_path_factory.mktemp("stages")), n_seq=SLOTS) as server:
        yield server


@pytest.fixture
def client(served: ApiServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.url + "/v1", api_key=served.token, max_retries=0, timeout=600) as c:
        yield c


def test_n_choices_differ_by_seed_and_repeat(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=HI, n=3, **SAMPLED)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2] and all(texts)
    assert len(set(texts)) == 3, texts  # each choice its own noise (sampler.py: seed, choice, index)
    again = client.chat.completions.create(model=MODEL, messages=HI, n=3, **SAMPLED)
    assert [c.message.content for c in again.choices] == texts
    alone = client.chat.completions.create(model=MODEL, messages=HI, **SAMPLED)
    assert alone.choices[0].message.content == texts[0]  # choice 0 is the request's own reply
    stats: Any = first.model_extra["kafila"]  # type: ignore[index]
    per = stats["choices"]
    assert first.usage is not None and first.usage.prompt_tokens == per[0]["prompt_tokens"]
    assert first.usage.completion_tokens == sum(c["completion_tokens"] for c in per)
    assert [c["cached_tokens"] for c in per] == [0, 0, 0]  # cache_prompt false: each computed afresh


def test_n_choices_share_one_prefill(client: openai.OpenAI) -> None:
    # a prompt no other test sends (a slot holds at most the chat template's opening of it): the first choice
    # prefills it, the others are forked all but its last token (or, had the first ended already, take its slot's
    # cache, which holds the same)
    moon: Any = [{"role": "user", "content": "Write one sentence about the moon."}]
    reply = client.chat.completions.create(model=MODEL, messages=moon, n=3, temperature=0.8, seed=1, max_tokens=4)
    per: Any = reply.model_extra["kafila"]["choices"]  # type: ignore[index]
    prompt = per[0]["prompt_tokens"]
    assert per[0]["cached_tokens"] < prompt - 1 and [c["cached_tokens"] for c in per[1:]] == [prompt - 1] * 2
    assert reply.usage is not None and reply.usage.prompt_tokens == prompt


def test_streamed_choices_carry_their_index_and_the_usage_of_all(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HI, n=2, **SAMPLED)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, n=2, stream=True,
                                                 stream_options={"include_usage": True}, **SAMPLED))
    texts = ["".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices and ch.choices[0].index == i)
             for i in range(2)]
    assert texts == [c.message.content for c in whole.choices]
    finishes = {ch.choices[0].index: ch.choices[0].finish_reason for ch in chunks
                if ch.choices and ch.choices[0].finish_reason}
    assert finishes == {0: whole.choices[0].finish_reason, 1: whole.choices[1].finish_reason}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_take_n_too(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="The sea is", n=2, temperature=0.8, seed=9, max_tokens=8,
                                      extra_body={"cache_prompt": False})
    assert [c.index for c in reply.choices] == [0, 1] and reply.choices[0].text != reply.choices[1].text
    per: Any = reply.model_extra["kafila"]["choices"]  # type: ignore[index]
    assert reply.usage is not None and reply.usage.completion_tokens == sum(c["completion_tokens"] for c in per)


def test_more_choices_than_slots_are_refused_naming_n_and_the_limit(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, n=SLOTS + 1, max_tokens=4)
    body: Any = info.value.body
    assert body["param"] == "n" and f"at most {SLOTS}" in body["message"], body
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, n=0, max_tokens=4)
    assert info.value.body["param"] == "n"  # type: ignore[index]
    assert client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0).choices


IMAGE: Any = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]


@pytest.mark.parametrize("kwargs, param", [
    ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "The sea"}}, "prediction"),
    ({"messages": IMAGE}, "messages[0].content"),
])
def test_fields_kafila_cannot_honour_are_400s_naming_them(client: openai.OpenAI, kwargs: dict[str, Any],
                                                          param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, **{"messages": HI, "max_tokens": 2, **kwargs})
    body: Any = err.value.body
    assert err.value.status_code == 400 and body["param"] == param, body
    # what asks for nothing more than text is no reason to refuse
    assert client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, modalities=["text"]).choices

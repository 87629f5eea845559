"""`logprobs`, `stop` and `usage` as the official `openai` package sees them, from a real API server in front of
a real head (the whole SmolLM2 as its one stage, in this process): the client's own models parse every shape,
and a streamed reply's chunks carry the same text and numbers as the whole reply."""

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

HI: Any = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The three primary colours are"
# each reply computes its prompt afresh: a prompt cache computed in other chunks moves the numbers a little
FRESH = {"cache_prompt": False}


@pytest.fixture(scope="module")
def served(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An ApiServer whose ring is a running solo head, on its own event loop in a thread."""
    with served_head(smollm, StageCache(tmp_path_factory.mktemp("stages"))) as server:
        yield server


@pytest.fixture
def client(served: ApiServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.url + "/v1", api_key=served.token, max_retries=0, timeout=60) as c:
        yield c


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0, logprobs=True,
                                           top_logprobs=3, extra_body=FRESH)
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(c.token for c in content) == whole.choices[0].message.content
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) == 3 and bytes(c.bytes or []).decode() == c.token
        assert c.top_logprobs[0].logprob >= c.logprob and c.top_logprobs[0].token == c.token  # greedy: the top one
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True, extra_body=FRESH,
                                                 stream_options={"include_usage": True}))
    streamed = [c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content or []]
    assert [(c.token, c.logprob, [t.token for t in c.top_logprobs]) for c in streamed] == [
        (c.token, c.logprob, [t.token for t in c.top_logprobs]) for c in content]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(content)
    plain = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None and plain.usage is not None


def test_completion_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                      extra_body=FRESH)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset is not None
    assert "".join(lp.tokens) == whole.choices[0].text and len(lp.tokens) == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(len(top) == 2 and max(top.values()) >= p for top, p in zip(lp.top_logprobs, lp.token_logprobs,
                                                                           strict=True))
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2,
                                            stream=True, extra_body=FRESH))
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []] == lp.tokens
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_a_chat_stop_string_through_the_client(client: openai.OpenAI) -> None:
    text = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0).choices[0]
    stop = (text.message.content or "")[3:7]
    cut = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == (text.message.content or "")[:3] and cut.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=0, stop=stop,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.choices[0].message.content


@pytest.mark.parametrize("kwargs, param", [({"top_logprobs": 3}, "top_logprobs"),
                                           ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                                           ({"n": 3}, "n"), ({"response_format": {"type": "json_schema"}},
                                                             "response_format.json_schema")])
def test_bad_or_unsupported_fields_are_400s(client: openai.OpenAI, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, **kwargs)
    assert err.value.status_code == 400 and err.value.body["param"] == param  # type: ignore[index]

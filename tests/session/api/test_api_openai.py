"""The chat API as the official `openai` package sees it: base_url + api_key (the session's token), stream or not.

A real ApiServer with a scripted ring behind it (tests/session/api_fixtures.py); the live-ring test
(test_api_live.py) checks the text itself against llama.cpp.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from kafila.session.api.server import ApiServer
from tests.session.api_fixtures import MODEL, ScriptedRing

pytestmark = pytest.mark.fast

HI: Any = [{"role": "user", "content": "hi"}]


def test_models_give_the_file_stem(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_a_whole_reply(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == "Hello, world" and reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens,
                                        reply.usage.total_tokens) == (9, 2, 11)
    assert reply.model == MODEL and reply.object == "chat.completion"


def test_a_streamed_reply_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, world"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 11


@pytest.mark.parametrize("kwargs, param", [({"temperature": 3}, "temperature"), ({"top_p": -1}, "top_p"),
                                           ({"max_tokens": 0}, "max_tokens"), ({"stop": list("abcde")}, "stop"),
                                           ({"extra_body": {"top_k": "40"}}, "top_k"), ({"n": 0}, "n")])
def test_a_bad_request_is_a_bad_request_error(client: openai.OpenAI, served: tuple[ApiServer, ScriptedRing],
                                              kwargs: dict[str, object], param: str) -> None:
    before = len(served[1].bodies)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=HI, **kwargs)  # type: ignore[call-overload]
    assert caught.value.status_code == 400 and caught.value.param == param and str(param) in caught.value.message
    assert len(served[1].bodies) == before


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_is_a_bad_request_error(client: openai.OpenAI, served: tuple[ApiServer, ScriptedRing],
                                                          stream: bool) -> None:
    served[1].script = [{"error": "the prompt is 900 tokens but the context holds 512 per request", "status": 400,
                         "param": "messages", "code": "context_length_exceeded"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=HI, stream=stream)
    assert caught.value.code == "context_length_exceeded" and "900 tokens" in caught.value.message


def test_a_wrong_key_is_an_authentication_error(served: tuple[ApiServer, ScriptedRing]) -> None:
    with openai.OpenAI(base_url=served[0].url + "/v1", api_key="not-the-token", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as caught:
            c.chat.completions.create(model=MODEL, messages=HI)
    assert "bearer token" in caught.value.message

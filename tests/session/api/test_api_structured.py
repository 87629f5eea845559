"""Structured output as the official `openai` package asks for it, from a real API server in front of a real head
(the whole SmolLM2 as its one stage, in this process): `parse` with a pydantic model gives the parsed object,
streamed or not, on chats and text completions; a schema the converter cannot handle is a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

from kafila.model.stage_cache import StageCache
from kafila.session.api.server import ApiServer
from tests.session.api_fixtures import MODEL
from tests.session.solo_head import served_head

pytestmark = pytest.mark.fast

ASK: Any = [{"role": "user", "content": "Give a European city as JSON."}]


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=20)
    population: int
    capital: bool


@pytest.fixture(scope="module")
def served(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """An ApiServer whose ring is a running solo head, on its own event loop in a thread."""
    with served_head(smollm, StageCache(tmp_path_factory.mktemp("stages"))) as server:
        yield server


@pytest.fixture
def client(served: ApiServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.url + "/v1", api_key=served.token, max_retries=0, timeout=120) as c:
        yield c


def test_parse_with_a_pydantic_model_gives_the_object_streamed_or_not(client: openai.OpenAI) -> None:
    reply = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=City, max_tokens=80,
                                          temperature=0)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and reply.choices[0].finish_reason == "stop"
    with client.chat.completions.stream(model=MODEL, messages=ASK, response_format=City, max_tokens=80,
                                        temperature=0) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == city


def test_a_schema_on_a_text_completion(client: openai.OpenAI) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": City.model_json_schema()}}
    reply = client.completions.create(model=MODEL, prompt="A JSON object describing a city:", max_tokens=60,
                                      temperature=0, extra_body={"response_format": schema})
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].text
    City.model_validate_json(reply.choices[0].text)


def test_a_schema_the_converter_cannot_handle_is_a_400_naming_it(client: openai.OpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "when": {"type": "strng"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                       response_format=bad)  # type: ignore[arg-type]
    assert err.value.status_code == 400 and err.value.param == "response_format.json_schema.schema"
    assert "strng" in err.value.message

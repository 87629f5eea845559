"""Structured output through a live ring (rendezvous, host and three members as real processes) with the
official `openai` client: `parse` with a pydantic model returns a parsed object from SmolLM2, and a schema the
converter cannot handle is a 400 naming it (streaming and greedy parity: test_api_structured.py, on a solo head)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import openai
import pydantic
import pytest

from tests.session.cluster import REPLY_TIMEOUT_S, Cluster

pytestmark = pytest.mark.slow

ASK: Any = [{"role": "user", "content": "Describe a famous programmer as JSON."}]


class Programmer(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    born: int
    languages: list[Annotated[str, pydantic.Field(max_length=16)]] = pydantic.Field(max_length=2)


# every reply the schema allows fits, so that `length` cannot end it: 24 + 2 * 16 characters of strings, each at
# most 6 bytes (a \uXXXX escape), 17 of the year and about 60 of JSON around them (single spaces only), a token at
# least a byte each; the ring's context (512) holds it after the 37 tokens of the prompt
MAX_TOKENS = 448


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("structured"), [("ada", []), ("bo", []), ("cy", [])])
    try:
        cluster.wait_phase({"admitted"})
        yield cluster
    finally:
        assert cluster.stop() == [], "processes hung on shutdown"


@pytest.fixture
def client(ring: Cluster) -> Iterator[openai.OpenAI]:
    from kafila.session.api.token import read_token

    with openai.OpenAI(base_url=ring.url + "/v1", api_key=read_token(ring.url), max_retries=0,
                       timeout=REPLY_TIMEOUT_S) as c:
        yield c


def test_parse_returns_a_parsed_object_from_smollm2(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    # sampled (the default temperature, no seed): whatever is drawn, the reply parses
    reply = client.chat.completions.parse(model=model, messages=ASK, response_format=Programmer,
                                          max_tokens=MAX_TOKENS)
    assert isinstance(reply.choices[0].message.parsed, Programmer), reply.choices[0].message.content


def test_a_schema_the_converter_cannot_handle_is_a_400_naming_it(client: openai.OpenAI) -> None:
    bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="kafila", messages=ASK, max_tokens=8, response_format=bad)
    assert err.value.param == "response_format.json_schema.schema" and "missing" in err.value.message

"""The API tests' scripted ring: a real ApiServer on its own loop in a thread, a ScriptedRing behind it
(tests/session/api_fixtures.py), and the `openai` client that calls it. The tests that serve a real solo head
instead (choices, log-probabilities, structured output) define `served` and `client` of their own."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from kafila.session.api.server import ApiServer
from tests.session.api_fixtures import ScriptedRing, server_in_thread


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ApiServer, ScriptedRing]]:
    with server_in_thread() as pair:
        yield pair


@pytest.fixture
def ring(served: tuple[ApiServer, ScriptedRing]) -> ScriptedRing:
    """The scripted ring, its script cleared: each test scripts its own replies."""
    served[1].script = None
    return served[1]


@pytest.fixture
def client(served: tuple[ApiServer, ScriptedRing], ring: ScriptedRing) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[0].url + "/v1", api_key=served[0].token, max_retries=0, timeout=30) as c:
        yield c

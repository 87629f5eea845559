"""Chats with tools at the head, on real llama.cpp: the prompt is the template's rendering of the tools and
the results, the API is told the dialect, and a forced call holds to its grammar in any dialect.

SmolLM2's own template knows no tools (the generic form); with a Qwen 2.5 template in its place (what
`--chat-template` does) the same model answers in Hermes/Qwen's `<tool_call>` syntax.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kafila.engine.chat.formats import GENERIC, HERMES
from kafila.engine.chat.parse import parse
from kafila.model.stage_cache import StageCache
from kafila.session.ring.head import Head
from tests.engine.chat_templates.cases import ONE_CALL, TIME, WEATHER, template
from tests.session.solo_head import N_CTX, solo_head

pytestmark = pytest.mark.slow  # real llama.cpp on prompts of hundreds of tokens (tools described)

ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


async def events(h: Head, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = [e async for e in h.chat(body)]
    assert "done" in out[-1], out[-1]
    return out


def text(evts: list[dict[str, Any]]) -> str:
    return "".join(e.get("delta", "") for e in evts)


async def test_the_prompt_is_the_templates_rendering_of_tools_and_results(head: Head) -> None:
    evts = await events(head, {"messages": ONE_CALL, "tools": [WEATHER, TIME], "max_tokens": 4, "temperature": 0})
    assert evts[0] == {"tool_format": GENERIC}
    rendered = head.vocab.format_chat(ONE_CALL, [WEATHER, TIME])
    assert "get_weather" in rendered.text and "18 degrees, sunny" in rendered.text
    assert evts[-1]["done"]["prompt_tokens"] == len(head.vocab.prompt_tokens(rendered))
    plain = await events(head, {"messages": ASK, "max_tokens": 4, "temperature": 0})
    assert "tool_format" not in plain[0]  # no tools: a plain chat, as before


async def test_tool_choice_none_is_plain_chat(head: Head) -> None:
    evts = await events(head, {"messages": ASK, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 4,
                               "temperature": 0})
    assert "tool_format" not in evts[0]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
async def test_a_forced_call_holds_to_the_grammar(head: Head, choice: Any) -> None:
    evts = await events(head, {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": 80,
                               "temperature": 0})
    reply = parse(GENERIC, text(evts))
    assert len(reply.calls) == 1 and evts[-1]["done"]["finish_reason"] == "stop", text(evts)
    tool = {"get_weather": WEATHER, "get_time": TIME}[reply.calls[0].name]
    assert choice == "required" or tool is TIME
    jsonschema.validate(json.loads(reply.calls[0].arguments), tool["function"]["parameters"])


@pytest.fixture
async def qwen_head(smollm: Path, stage_cache: StageCache) -> AsyncIterator[Head]:
    """SmolLM2 with Qwen 2.5's template in place of its own (what the host's --chat-template does)."""
    async with solo_head(smollm, stage_cache, N_CTX, chat_template=template("Qwen-Qwen2.5-7B-Instruct")) as h:
        yield h


async def test_another_template_gives_its_own_dialect(qwen_head: Head) -> None:
    evts = await events(qwen_head, {"messages": ASK, "tools": [WEATHER], "tool_choice": "required",
                                    "max_tokens": 80, "temperature": 0, "parallel_tool_calls": False})
    assert evts[0] == {"tool_format": HERMES}
    reply = parse(HERMES, text(evts))
    assert text(evts).startswith("<tool_call>") and len(reply.calls) == 1, text(evts)
    jsonschema.validate(json.loads(reply.calls[0].arguments), WEATHER["function"]["parameters"])

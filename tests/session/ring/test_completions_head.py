"""Text completions (`prompt`, no chat template) at the head, on real llama.cpp, against llama-cpp-python's own.

A ring of one: the whole SmolLM2 as the head's stage, in this process. The greedy text of a raw
prompt equals llama-cpp-python's `create_completion` (BOS added as it adds it), with and without a
stop string that falls across tokens; a head whose model has no chat template refuses chats by code
and completes text.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kafila.session.ring.chat_request import NO_CHAT_TEMPLATE
from kafila.session.ring.head import Head
from tests.conftest import reference_llama
from tests.session.solo_head import N_CTX

pytestmark = pytest.mark.fast

PROMPT = "Once upon a time, in a small village by the sea,"
LONG = 32


def llama_cpp_completion(model: Path, prompt: str, max_tokens: int, stop: list[str] | None = None) -> dict[str, Any]:
    """Ground truth: llama-cpp-python's greedy completion of the raw prompt on the whole file (its choice)."""
    with reference_llama(model, N_CTX) as m:
        out = m.create_completion(prompt, max_tokens=max_tokens, temperature=0, stop=stop)
        return dict(out["choices"][0])


async def events(h: Head, body: Any) -> list[dict[str, Any]]:
    return [e async for e in h.chat(body)]


def text_of(evts: list[dict[str, Any]]) -> str:
    return "".join(e.get("delta", "") for e in evts)


async def test_greedy_completion_and_stop_strings_match_llama_cpp(head: Head, smollm: Path) -> None:
    whole = await asyncio.to_thread(llama_cpp_completion, smollm, PROMPT, LONG)
    got = await events(head, {"prompt": PROMPT, "max_tokens": LONG, "temperature": 0})
    assert text_of(got) == whole["text"] and len(whole["text"]) > 20
    assert got[-1]["done"]["finish_reason"] == whole["finish_reason"]
    assert got[-1]["done"]["prompt_tokens"] == len(head.vocab.tokenize(PROMPT))
    # a stop string from the middle of that text, five characters (so almost surely across a token boundary)
    stop = whole["text"][12:17]
    expected = await asyncio.to_thread(llama_cpp_completion, smollm, PROMPT, LONG, [stop, "never appears"])
    got = await events(head, {"prompt": PROMPT, "max_tokens": LONG, "temperature": 0,
                              "stop": [stop, "never appears"]})
    assert text_of(got) == expected["text"] == whole["text"][:whole["text"].index(stop)]
    assert got[-1]["done"]["finish_reason"] == expected["finish_reason"] == "stop"


async def test_a_prompt_past_the_context_is_refused_with_the_numbers(head: Head) -> None:
    got = await events(head, {"prompt": "word " * 2000})
    assert len(got) == 1 and got[0]["status"] == 400 and got[0]["param"] == "prompt"
    assert got[0]["code"] == "context_length_exceeded" and f"the context holds {N_CTX} per request" in got[0]["error"]
    assert int(got[0]["error"].split("the prompt is ")[1].split()[0]) == len(head.vocab.tokenize("word " * 2000))


async def test_a_model_without_a_chat_template_refuses_chats_and_completes_text(head: Head, smollm: Path) -> None:
    head.vocab.chat_template = None  # as a base model's head has it (the real one is tested on a ring)
    got = await events(head, {"messages": [{"role": "user", "content": PROMPT}]})
    assert len(got) == 1 and got[0]["status"] == 400 and got[0]["code"] == NO_CHAT_TEMPLATE
    assert "/v1/completions" in got[0]["error"]
    expected = await asyncio.to_thread(llama_cpp_completion, smollm, PROMPT, 8)
    assert text_of(await events(head, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})) == expected["text"]


async def test_an_empty_prompt_starts_from_bos_or_is_refused(head: Head) -> None:
    got = await events(head, {"prompt": "", "max_tokens": 2, "temperature": 0})
    if head.vocab.tokenize(""):  # the model adds BOS: llama.cpp completes from it
        assert "done" in got[-1]
    else:
        assert len(got) == 1 and got[0]["status"] == 400 and got[0]["param"] == "prompt"

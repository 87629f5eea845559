"""The sampling fields of a chat body at the head, on real llama.cpp: logit_bias and the penalties give the
greedy reply llama-cpp-python gives with llama.cpp's own samplers on its logits; a seeded sampled reply with
them comes out the same twice; `logprobs` are the log-softmax of llama-cpp-python's logits at each step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kafila.session.ring.head import Head
from tests.conftest import reference_llama
from tests.engine.llama_samplers import LlamaSamplers, greedy_reply, last_logits
from tests.session.solo_head import N_CTX

pytestmark = pytest.mark.fast

QUESTION = "Write the days of the week, one per line."
LONG = 20
SHAPING = {"repeat_penalty": 1.2, "repeat_last_n": 16, "frequency_penalty": 0.5, "presence_penalty": 0.3}


async def reply(h: Head, body: dict[str, Any]) -> tuple[list[int], str, dict[str, Any]]:
    evts = [e async for e in h.chat(body)]
    assert "done" in evts[-1], evts[-1]
    return ([t for e in evts for t in e.get("tokens", [])], "".join(e.get("delta", "") for e in evts),
            evts[-1]["done"])


def llama_cpp_greedy(model: Path, prompt: list[int], bias: dict[str, float]) -> tuple[list[int], list[int]]:
    """llama-cpp-python's greedy reply to `prompt` plainly, and with the bias and SHAPING (llama.cpp's samplers)."""
    with reference_llama(model, N_CTX) as m:
        plain = greedy_reply(m, prompt, LlamaSamplers(m.n_vocab()), LONG)
        pairs = [(int(t), b) for t, b in bias.items()] if bias else [(plain[1], -100.0)]
        s = SHAPING
        samplers = LlamaSamplers(m.n_vocab(), pairs, s["repeat_penalty"], s["repeat_last_n"],
                                 s["frequency_penalty"], s["presence_penalty"])
        try:
            return plain, greedy_reply(m, prompt, samplers, LONG)
        finally:
            samplers.close()


async def test_bias_and_penalties_in_a_chat_body_give_llama_cpps_greedy_reply(head: Head, smollm: Path) -> None:
    chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": LONG, "temperature": 0}
    prompt = head.vocab.chat_tokens([{"role": "user", "content": QUESTION}])
    plain, _ = await asyncio.to_thread(llama_cpp_greedy, smollm, prompt, {})
    bias = {str(plain[1]): -100, str(plain[3]): 2.5}
    _, truth = await asyncio.to_thread(llama_cpp_greedy, smollm, prompt, bias)
    assert (await reply(head, chat))[0] == plain
    got = await reply(head, {**chat, "logit_bias": bias, **SHAPING})
    assert got[0] == truth != plain and plain[1] not in truth
    assert got[2]["completion_tokens"] == len(truth)


async def test_a_seeded_sampled_reply_with_every_field_repeats(head: Head) -> None:
    chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": LONG, "temperature": 1.0,
            "seed": 99, "min_p": 0.05, "logit_bias": {"11": 1.5}, **SHAPING}
    first = await reply(head, chat)
    assert len(first[0]) > 3 and (await reply(head, chat))[:2] == first[:2]
    assert (await reply(head, {**chat, "seed": 100}))[:2] != first[:2]


def llama_cpp_log_softmax(model: Path, prompt: list[int], reply: list[int]) -> list[np.ndarray]:
    """Ground truth: the log-softmax of llama-cpp-python's logits before each token of `reply`."""
    with reference_llama(model, N_CTX) as m:
        m.eval(prompt)
        rows = []
        for t in reply:
            z = last_logits(m).astype(np.float64)
            rows.append(z - z.max() - np.log(np.exp(z - z.max()).sum()))
            m.eval([t])
        return rows


async def test_logprobs_are_the_log_softmax_of_llama_cpps_logits(head: Head, smollm: Path) -> None:
    chat = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": LONG, "temperature": 0,
            "logprobs": True, "top_logprobs": 5, "cache_prompt": False, **SHAPING}  # penalties move no number
    evts = [e async for e in head.chat(chat)]
    tokens = [t for e in evts for t in e.get("tokens", [])]
    entries = [x for e in evts for x in e.get("logprobs", [])]
    assert len(entries) == len(tokens) == evts[-1]["done"]["completion_tokens"] > 5
    prompt = head.vocab.chat_tokens([{"role": "user", "content": QUESTION}])
    truth = await asyncio.to_thread(llama_cpp_log_softmax, smollm, prompt, tokens)
    worst = 0.0
    for token, entry, logp in zip(tokens, entries, truth, strict=True):
        assert entry["bytes"] == list(head.vocab.piece(token))
        worst = max(worst, abs(entry["logprob"] - logp[token]))
        top = np.argsort(-logp, kind="stable")[:5]
        assert [t["bytes"] for t in entry["top_logprobs"]] == [list(head.vocab.piece(int(t))) for t in top]
        worst = max(worst, *(abs(t["logprob"] - logp[i]) for t, i in zip(entry["top_logprobs"], top, strict=True)))
    print(f"max |logprob - llama-cpp-python's| = {worst:.2e}")
    assert worst < 1e-4

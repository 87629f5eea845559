"""The logit bias, penalties and min-p against llama.cpp's own samplers, and a greedy reply with them against
llama-cpp-python decoding the same prompt with llama.cpp's samplers on its own logits, step by step; with
speculation (prompt lookup, or the true continuation drafted) the reply is the same, and a stop string inside
the accepted drafted tokens still ends it before the string."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kafila.engine.chain import LocalChain, open_chain
from kafila.engine.request import Request
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.model.stage_cache import StageCache
from kafila.session.ring.speculation import Speculator
from tests.conftest import reference_llama
from tests.engine.llama_samplers import LlamaSamplers, apply, greedy_reply
from tests.engine.test_speculation_exact import Scripted

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=64)
MAX_TOKENS = 24
PROMPT = "Count from one to twelve in words, separated by commas."
PENALISED = {"repeat_penalty": 1.3, "repeat_last_n": 32, "frequency_penalty": 0.6, "presence_penalty": 0.4}


@pytest.mark.parametrize("case", range(6))
def test_bias_and_penalties_are_llama_cpps_arithmetic(case: int) -> None:
    rng = np.random.default_rng(case)
    n = 300
    logits = rng.normal(0, 4, n).astype(np.float32)
    prompt, reply = rng.integers(0, n, 50).tolist(), rng.integers(0, n, 30).tolist()
    bias = tuple(sorted({int(t): float(rng.uniform(-50, 50)) for t in rng.integers(0, n, 20)}.items()))
    params = SamplingParams(repeat_penalty=float(rng.uniform(0.5, 2)), repeat_last_n=int(rng.integers(1, 90)),
                            frequency_penalty=float(rng.uniform(-2, 2)), presence_penalty=float(rng.uniform(-2, 2)),
                            logit_bias=bias)
    ours = Sampler(params, prompt)
    theirs = LlamaSamplers(n, bias, params.repeat_penalty, params.repeat_last_n, params.frequency_penalty,
                           params.presence_penalty)
    theirs.prime(prompt)
    for t in reply:
        ours.accept(t)
        theirs.accept(t)
    try:
        assert np.abs(ours.adjusted(logits) - theirs.adjust(logits)).max() < 1e-4
    finally:
        theirs.close()


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 0.9])
def test_min_p_keeps_what_llama_cpps_min_p_keeps(min_p: float) -> None:
    from kafila.engine.llama_lib import llama

    logits = np.random.default_rng(7).normal(0, 3, 500).astype(np.float32)
    sampler = llama().llama_sampler_init_min_p(min_p, 1)
    try:
        kept = np.isfinite(apply(sampler, logits))
    finally:
        llama().llama_sampler_free(sampler)
    p = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=min_p)).distribution(logits)
    assert (p > 0).tolist() == kept.tolist() and 1 <= kept.sum() < len(logits)


def test_a_banned_token_is_never_sampled() -> None:
    logits = np.array([5.0, 1.0, 4.9], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=2.0, top_k=0, top_p=1.0, seed=3, logit_bias=((0, -100.0),)))
    assert {sampler.sample(logits) for _ in range(200)} == {1, 2}


@pytest.fixture(scope="module")
def chain(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalChain]:
    c = open_chain(smollm, "10,20", CONFIG, StageCache(tmp_path_factory.mktemp("stages")))
    yield c
    c.close()


def run(chain: LocalChain, params: SamplingParams, drafter: object = None,
        stop: tuple[str, ...] = ()) -> tuple[list[int], str, Request]:
    tokens = chain.vocab.chat_tokens([{"role": "user", "content": PROMPT}])
    r = Request(0, tokens, MAX_TOKENS, CONFIG.n_ctx_per_seq, Sampler(params, tokens), chain.vocab,
                drafter=drafter, stop=stop)  # type: ignore[arg-type]
    text = "".join(piece for _, piece in chain.run([r]))
    chain.free(0)
    return r.generated, text, r


@pytest.fixture(scope="module")
def expected(chain: LocalChain, smollm: Path) -> tuple[list[int], list[int], tuple[tuple[int, float], ...]]:
    """llama-cpp-python's greedy reply without and with the penalties and a bias banning the plain reply's
    third token and favouring another."""
    tokens = chain.vocab.chat_tokens([{"role": "user", "content": PROMPT}])
    with reference_llama(smollm, CONFIG.n_ctx_per_seq) as m:
        plain = greedy_reply(m, tokens, LlamaSamplers(m.n_vocab()), MAX_TOKENS)
        bias = ((plain[2], -100.0), (plain[5], 3.5))
        p = PENALISED
        samplers = LlamaSamplers(m.n_vocab(), bias, p["repeat_penalty"], p["repeat_last_n"], p["frequency_penalty"],
                                 p["presence_penalty"])
        shaped = greedy_reply(m, tokens, samplers, MAX_TOKENS)
        samplers.close()
    return plain, shaped, bias


def shaped_params(bias: tuple[tuple[int, float], ...]) -> SamplingParams:
    return SamplingParams(0.0, logit_bias=bias, **PENALISED)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shaped(chain: LocalChain, expected: tuple[list[int], list[int], tuple[tuple[int, float], ...]]
           ) -> tuple[list[int], str]:
    """Kafila's greedy reply with the penalties and the bias (no speculation)."""
    return run(chain, shaped_params(expected[2]))[:2]


def test_a_greedy_reply_with_penalties_and_bias_is_llama_cpps_with_or_without_speculation(
        chain: LocalChain, expected: tuple[list[int], list[int], tuple[tuple[int, float], ...]],
        shaped: tuple[list[int], str]) -> None:
    plain, truth, bias = expected
    assert run(chain, SamplingParams(0.0))[0] == plain
    assert shaped[0] == truth and truth != plain and plain[2] not in truth
    speculator = Speculator("lookup", lambda: (0.120, 0.009))  # slow links: lookup drafts every step it can
    assert run(chain, shaped_params(bias), speculator.drafter())[:2] == shaped


def test_a_stop_string_in_accepted_drafted_tokens_ends_the_reply_before_it(
        chain: LocalChain, expected: tuple[list[int], list[int], tuple[tuple[int, float], ...]],
        shaped: tuple[list[int], str]) -> None:
    tokens, text = shaped
    stop = text[len(text) // 2: len(text) // 2 + 4]
    truth = Scripted(len(chain.vocab.chat_tokens([{"role": "user", "content": PROMPT}])), tokens)
    _, cut, r = run(chain, shaped_params(expected[2]), truth, stop=(stop,))
    assert cut == text[:text.index(stop)] and r.finish_reason == "stop" and truth.accepted > len(tokens) / 3


def test_a_seeded_sampled_reply_with_penalties_repeats_with_or_without_speculation(chain: LocalChain) -> None:
    params = SamplingParams(0.9, 40, 0.95, 1234, min_p=0.05, logit_bias=((11, 2.0),), **PENALISED)  # type: ignore[arg-type]
    first = run(chain, params)[:2]
    assert len(first[0]) > 3 and run(chain, params, Speculator("lookup", lambda: (0.120, 0.009)).drafter())[:2] == first

"""Sampler: greedy is argmax, filters keep only allowed tokens, a seed reproduces a run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kafila.engine.sampler import Sampler, SamplingParams, top_first

pytestmark = pytest.mark.fast

logits_st = arrays(np.float32, st.integers(2, 64), elements=st.floats(-20, 20, width=32))


@given(logits_st)
def test_greedy_is_first_argmax(logits: np.ndarray) -> None:
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == int(np.argmax(logits))


@given(arrays(np.float64, st.integers(1, 80), elements=st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0, np.nan])),
       st.integers(0, 90))
def test_the_top_k_are_the_full_sorts_first_k_ties_and_all(z: np.ndarray, k: int) -> None:
    # few distinct values: ties at the k-th value everywhere, which the stable sort breaks by index
    assert top_first(z, k).tolist() == np.argsort(-z, kind="stable")[: k or None].tolist()


@settings(max_examples=60)
@given(logits_st, st.integers(1, 8), st.integers(0, 2**31))
def test_top_k_stays_in_top_k(logits: np.ndarray, k: int, seed: int) -> None:
    token = Sampler(SamplingParams(temperature=1.0, top_k=k, top_p=1.0, seed=seed)).sample(logits)
    # ties at the k-th value may be chosen either way; the value must be among the k largest
    assert logits[token] >= np.sort(logits)[::-1][min(k, len(logits)) - 1]


@given(logits_st, st.integers(0, 2**31))
def test_tiny_top_p_is_greedy(logits: np.ndarray, seed: int) -> None:
    token = Sampler(SamplingParams(temperature=0.7, top_k=0, top_p=1e-9, seed=seed)).sample(logits)
    assert token == int(np.argmax(logits))


def test_seed_reproduces_and_distribution_follows_softmax() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=42)
    a, b = Sampler(params), Sampler(params)
    draws = [a.sample(logits) for _ in range(4000)]
    assert draws[:50] == [b.sample(logits) for _ in range(50)]
    freq = np.bincount(draws, minlength=3) / len(draws)
    assert np.allclose(freq, [0.5, 0.3, 0.2], atol=0.03)


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_params(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"temperature": float("nan")}, {"temperature": float("inf")},
                                    {"temperature": None}, {"temperature": "0.7"}, {"top_k": "40"},
                                    {"top_k": 4.0}, {"top_p": float("nan")}, {"seed": -1}, {"seed": "7"}])
def test_bad_params_from_a_request_body(kwargs: dict[str, object]) -> None:
    # what a hostile chat body could hand the head: each is refused here, never reaches numpy
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


@given(logits_st, st.floats(5e-324, 1e-3, allow_subnormal=True) | st.just(1e-310), st.integers(0, 2**31))
def test_tiny_temperature_is_greedy_not_nan(logits: np.ndarray, temperature: float, seed: int) -> None:
    """No NaN however small the temperature, and a token trailing the best by g has probability below
    e^(-g/T): one trailing by 50·T or more (p < 2e-22) is never drawn. Only near-ties with the top remain."""
    token = Sampler(SamplingParams(temperature=temperature, top_k=0, top_p=1.0, seed=seed)).sample(logits)
    assert float(logits.max()) - float(logits[token]) < 50 * temperature


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_coupled_draft_leaves_the_targets_distribution_and_agrees_often(seed: int) -> None:
    # a small vocabulary, the target's and a different draft's random logits: each reply index's token, drawn
    # with that index's noise, is distributed as p (Pearson's chi-square, 7 degrees of freedom), and the draft
    # drawing with the same noise guesses it as often as Gumbel coupling promises, (1 - TV) / (1 + TV) at least,
    # and far more often than an independent draw would (sum p·q)
    rng = np.random.default_rng(seed)
    target, draft = rng.normal(0, 1.5, 8).astype(np.float32), rng.normal(0, 1.5, 8).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, seed=seed)
    sampler, drafter = Sampler(params), Sampler(params)
    p, q = sampler.distribution(target), drafter.distribution(draft)
    n = 20_000
    tokens = np.array([sampler.draw(target, i) for i in range(n)])
    guesses = np.array([drafter.draw(draft, i) for i in range(n)])
    counts = np.bincount(tokens, minlength=8)
    chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
    assert chi2 < 24.32, (chi2, counts / n, p)  # the 0.1 % critical value
    agree = float(np.mean(tokens == guesses))
    tv = float(np.abs(p - q).sum()) / 2
    assert agree >= (1 - tv) / (1 + tv) - 0.02 and agree > 3 * float(p @ q), (agree, tv, float(p @ q))
    # ... and the draft's own guesses are far from p: agreement is the noise's doing, not the same distribution
    own = np.bincount(guesses, minlength=8)
    assert float((((own - n * p) ** 2) / (n * p)).sum()) > 1000


def test_a_token_is_a_function_of_seed_choice_and_index_only() -> None:
    # what lets a reply resumed from its k-th token go on as the uncut one, and n choices differ
    logits = np.random.default_rng(0).normal(0, 2, 300).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, seed=77)
    uncut = Sampler(params)
    tokens = [uncut.sample(logits) for _ in range(40)]
    resumed = Sampler(params, reply=tokens[:25])
    assert [resumed.sample(logits) for _ in range(15)] == tokens[25:]
    assert [Sampler(params).draw(logits, i) for i in range(40)] == tokens
    other = Sampler(SamplingParams(temperature=0.9, top_k=0, top_p=1.0, seed=77, choice=1))
    assert [other.sample(logits) for _ in range(40)] != tokens
    unseeded = Sampler(SamplingParams(temperature=0.9, top_k=0, top_p=1.0))
    assert unseeded.params.seed is not None  # drawn once: a draft model shares it

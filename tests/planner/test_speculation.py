"""How many drafted tokens a step carries: the best expected tokens per second of the frame, by brute force
over every length, and never a draft where the circuit costs nothing beside its compute."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.planner.speculation import best_draft, expected_tokens

pytestmark = pytest.mark.fast

alphas = st.floats(0.0, 0.999)
seconds = st.floats(1e-4, 1.0)


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.5, 0) == 1
    assert expected_tokens(0.5, 3) == pytest.approx((1 - 0.5**4) / (1 - 0.5))
    assert expected_tokens(1.0, 4) == 5


@given(alphas, st.integers(0, 16), seconds, seconds, st.integers(0, 3))
def test_the_draft_is_the_best_rate_of_all_lengths(alpha: float, n: int, network: float, step: float,
                                                   others: int) -> None:
    k = best_draft(alpha, n, network, step, others)
    rates = [(others + expected_tokens(alpha, j)) / (network + (j + 1) * step) for j in range(n + 1)]
    assert 0 <= k <= n and rates[k] == max(rates)


@given(alphas, st.integers(0, 16), seconds, st.integers(0, 3))
def test_no_draft_when_the_circuit_is_all_compute(alpha: float, n: int, step: float, others: int) -> None:
    # each drafted row costs a whole step and yields less than one token: it never pays
    assert best_draft(alpha, n, 0.0, step, others) == 0


@given(alphas, st.integers(1, 16), seconds, seconds)
def test_a_longer_circuit_never_shortens_the_draft(alpha: float, n: int, network: float, step: float) -> None:
    assert best_draft(alpha, n, 2 * network, step) >= best_draft(alpha, n, network, step)


def test_forty_ms_links_draft_long_for_a_likely_copy_and_nothing_for_a_guess() -> None:
    assert best_draft(0.9, 16, 0.120, 0.009) >= 6
    assert best_draft(0.05, 16, 0.120, 0.009) == 0
    assert best_draft(0.05, 16, 0.120, 0.009, at_least=1) == 1  # `--speculate lookup`: one token at least

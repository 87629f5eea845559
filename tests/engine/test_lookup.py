"""Prompt lookup: the draft is what followed the latest earlier occurrence of the longest matching suffix
(brute force over every length and place), however the request's tokens grew."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.engine.lookup import LONGEST, Lookup, Match

pytestmark = pytest.mark.fast


def brute(tokens: list[int], limit: int) -> Match | None:
    """Every suffix length from the longest, every earlier end from the latest."""
    for n in range(min(LONGEST, len(tokens)), 0, -1):
        suffix = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n:end] == suffix:
                return Match(n, tokens[end:end + limit])
    return None


@given(st.lists(st.integers(0, 4), min_size=1, max_size=60), st.lists(st.integers(1, 8), max_size=6),
       st.integers(1, 8))
def test_the_match_is_the_brute_force_one_as_the_tokens_grow(tokens: list[int], grow: list[int], limit: int) -> None:
    lookup = Lookup()
    end = 1
    for g in [*grow, len(tokens)]:  # the index grows with the reply: asked at several lengths, one index
        end = min(end + g, len(tokens))
        assert lookup.match(tokens[:end], limit) == brute(tokens[:end], limit)


def test_a_copied_sentence_is_drafted_from_the_prompt() -> None:
    prompt = [5, 6, 7, 8, 9, 10, 11, 1, 2]
    # the reply has begun copying 6, 7: what followed them in the prompt is drafted
    assert Lookup().match([*prompt, 6, 7], 3) == Match(2, [8, 9, 10])
    assert Lookup().match([1, 2, 3], 4) is None  # nothing earlier to match

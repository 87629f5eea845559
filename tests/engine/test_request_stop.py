"""Stop strings in a request's text stream, against brute force over every way the text can arrive in pieces.

A stop string may be split across pieces (tokens); the text handed out must never include a stop
string or anything after it, nor lose text that turned out not to start one. Brute force: the text
ends at the first piece after which some stop string occurs, cut before the earliest occurrence.
The same logic against llama-cpp-python on a real model is in tests/session/ring/test_completions_head.py.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.engine.request import Request

pytestmark = pytest.mark.fast

ALPHABET = "abc "  # few letters, so stop strings occur and split across pieces often


def brute_force(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """(the text handed out, whether a stop string ended it)."""
    text = ""
    for piece in pieces:
        text += piece
        found = [text.find(s) for s in stops if s in text]
        if found:
            return text[:min(found)], True
    return text, False


def request(stops: list[str]) -> Request:
    # only the text stream is exercised: no token is sampled, so no vocabulary or sampler is needed
    none = cast(Any, None)
    return Request(0, [1], 1000, 2000, none, none, stop=tuple(stops))


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.text(ALPHABET, max_size=4), max_size=8),
       st.lists(st.text(ALPHABET, min_size=1, max_size=3), max_size=4))
def test_stop_strings_cut_the_text_as_brute_force_does(pieces: list[str], stops: list[str]) -> None:
    req = request(stops)
    out = []
    for i, piece in enumerate(pieces):
        if i == len(pieces) - 1:
            req.finish_reason = "length"  # the last piece ends the request (as max_tokens does): held text goes out
        out.append(req._stopped(piece))
        if req.finish_reason == "stop":
            break
    expected, stopped = brute_force(pieces, stops)
    assert "".join(out) == expected
    assert (req.finish_reason == "stop") == stopped


def test_a_stop_string_split_across_pieces_is_held_back_then_cut() -> None:
    req = request(["\n\nQ:"])
    assert req._stopped("Paris.\n") == "Paris."  # "\n" may begin the stop string: held
    assert req._stopped("\n") == ""
    assert req._stopped("Q: next") == "" and req.finish_reason == "stop"
    other = request(["\n\nQ:"])
    assert other._stopped("Paris.\n") == "Paris." and other._stopped("It") == "\nIt"  # not a stop: released


@settings(max_examples=300, deadline=None)
@given(st.text("ab x", max_size=30), st.text("ab x", min_size=1, max_size=4), st.data())
def test_a_stream_never_shows_the_stop_string_and_holds_back_only_what_may_become_it(
        text: str, stop: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    req, shown, seen = request([stop]), "", ""
    for piece in pieces:
        seen += piece
        shown += req._stopped(piece)
        assert stop not in shown
        if req.finish_reason == "stop":
            break
        # what is held is the longest end of the text so far that a stop string could still grow from
        held = seen[len(shown):]
        assert seen.startswith(shown) and held == max(
            (seen[-k:] for k in range(1, min(len(stop), len(seen) + 1)) if stop.startswith(seen[-k:])),
            key=len, default="")
    expected = text[:text.index(stop)] if stop in text else text
    if req.finish_reason != "stop":
        req.finish_reason = "length"  # the end of the reply: what was held goes out
        shown += req._stopped("")
    assert shown == expected

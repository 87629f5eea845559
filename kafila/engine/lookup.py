"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of a request's last n tokens.

It needs no model and pays where a reply copies from its input (an edit, a rewrite, an extract, code):
llama.cpp's `lookup` example and prompt-lookup decoding do the same. Longer matches are tried first
(`longest` down to 1 token); each length's drafts are accepted at their own rate (speculation.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

LONGEST = 3


@dataclass(frozen=True)
class Match:
    """What followed the latest earlier occurrence of the last `n` tokens (at most the limit asked for)."""

    n: int
    tokens: list[int]


@dataclass
class Lookup:
    """An n-gram index over one request's tokens (prompt + reply), grown as the reply grows."""

    longest: int = LONGEST
    _latest: list[dict[tuple[int, ...], int]] = field(default_factory=list)  # per n: n-gram -> end of its latest
    _indexed: int = 0  # n-grams ending before this index are in _latest

    def __post_init__(self) -> None:
        self._latest = [{} for _ in range(self.longest + 1)]

    def match(self, tokens: Sequence[int], limit: int) -> Match | None:
        """The longest match of the last tokens that occurred earlier, with what followed it; None when none."""
        end = len(tokens)
        # index every n-gram ending before the last token: the suffix must not match itself
        for e in range(max(self._indexed, 1), end):
            for n in range(1, min(self.longest, e) + 1):
                self._latest[n][tuple(tokens[e - n : e])] = e
        self._indexed = max(self._indexed, end)
        for n in range(min(self.longest, end), 0, -1):
            after = self._latest[n].get(tuple(tokens[end - n :]))
            if after is not None:
                return Match(n, list(tokens[after : after + limit]))
        return None

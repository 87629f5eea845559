"""Token sampling from logits: greedy, or temperature with top-k, top-p and min-p, reproducible by seed.

The logits are first adjusted by the request's logit_bias and penalties (penalties.py), in llama.cpp's
order: bias, penalties, top-k, top-p, min-p, temperature. A request's grammar (grammar.py) constrains the
token drawn, as llama.cpp's common sampler does: the whole vocabulary only when the token drawn breaks it.

Each reply token is drawn with noise of its own, derived from (seed, choice, token index) alone: the
Gumbel-max trick, token = argmax over the kept tokens of log p + g, with g a Gumbel variable per token id,
gives exactly the distribution p. So a reply's i-th token does not depend on how many draws came before
it: a reply resumed on another ring from its first k tokens draws what the uncut one drew, and a draft
model drawing its guesses with the same noise (draft.py) is verified by plain comparison, the reply being
the one plain decoding gives whatever was drafted (drafter-invariant speculative decoding: Daliri, Musco
and Suresh 2024, "Coupling without communication"). A grammar's second draw uses the same token's noise."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kafila.engine.grammar import Grammar, GrammarError
from kafila.engine.penalties import History


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0, top_p 1.0 and min_p 0 disable those filters; penalties.py says
    what the penalties and logit_bias ((token, bias) pairs) do."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    choice: int = 0  # which of a request's n choices: each has noise of its own (the seed's own for choice 0)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # llama.cpp's default window
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        # Checked by type as well as range: these come from request bodies, and NaN passes every
        # comparison (a NaN temperature once made NaN probabilities and took a head down).
        if not _real(self.temperature) or not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not _real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.choice, int) or isinstance(self.choice, bool) or self.choice < 0:
            raise ValueError(f"choice must be an integer >= 0, got {self.choice!r}")
        if not _real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty", "repeat_penalty"):
            if not _real(getattr(self, name)) or not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty!r}")
        if not isinstance(self.repeat_last_n, int) or isinstance(self.repeat_last_n, bool) or self.repeat_last_n < 0:
            raise ValueError(f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}")
        if not all(isinstance(t, int) and t >= 0 and _real(b) and math.isfinite(b) for t, b in self.logit_bias):
            raise ValueError("logit_bias must hold (token id >= 0, finite bias) pairs")


def _real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


class Sampler:
    """Samples one request's tokens; holds that request's seed, how many tokens it has drawn, the tokens its
    penalties count (the prompt and a resumed reply's tokens so far to start with, then each token the reply
    takes) and its grammar, if any (advanced over the resumed reply's tokens, then over each token the reply
    takes). Without a seed, one is drawn here: the request's draft model must share it (speculation.py)."""

    def __init__(self, params: SamplingParams, prompt: Sequence[int] = (), reply: Sequence[int] = (),
                 grammar: Grammar | None = None) -> None:
        if params.seed is None:
            params = replace(params, seed=int(np.random.SeedSequence().generate_state(2, np.uint64)[0]))
        self.params = params
        self.drawn = len(reply)  # the index of the reply token the next sample() draws (a resumed one's go on)
        self.history = History(params)
        self.history.prime(prompt, reply)
        self.grammar = grammar
        if grammar is not None:
            for token in reply:
                grammar.accept(token)

    def accept(self, token: int) -> None:
        """A token the reply took (sampled, or drafted and verified): the penalties count it from now on, and
        the grammar moves past it."""
        self.history.accept(token)
        if self.grammar is not None:
            self.grammar.accept(token)

    def adjusted(self, logits: np.ndarray) -> np.ndarray:
        """The logits this sampler draws from: with the logit bias and the penalties (penalties.py)."""
        return self.history.adjust(logits) if self.history.active else logits

    def sample(self, logits: np.ndarray) -> int:
        """The next reply token's id, for one row of logits (each call draws the next token index; one the
        grammar allows)."""
        token = self.draw(logits, self.drawn)
        self.drawn += 1
        return token

    def draw(self, logits: np.ndarray, index: int) -> int:
        """The reply's token number `index` for this row of logits: a function of the logits, the seed, the
        choice, the index and the grammar only (the module's docstring says why)."""
        token = self._draw(logits, index)
        if self.grammar is None or self.grammar.allows(token):
            return token
        return self._draw(self._constrained(logits), index)  # as llama.cpp's common_sampler_sample resamples

    def _constrained(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with every token the grammar refuses here at -inf."""
        assert self.grammar is not None
        masked = self.grammar.mask(logits)
        if not np.isfinite(masked).any():
            raise GrammarError("the grammar allows no token of this vocabulary here")
        return masked

    def _draw(self, logits: np.ndarray, index: int) -> int:
        logits = self.adjusted(logits)
        if self.params.temperature == 0.0:
            return int(np.argmax(logits))  # first maximum, as llama.cpp's greedy sampler
        order, probs = self._filtered(logits)
        # uniform noise for every token id, turned into Gumbel noise only for the kept ones (0.2 ms, not 1.3)
        u = np.random.default_rng([self.params.seed or 0, self.params.choice, index]).random(len(logits))
        with np.errstate(divide="ignore"):
            score = np.log(probs) - np.log(-np.log(u[order]))
        return int(order[int(np.argmax(score))])

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probability of every token under these settings (greedy: all on the first maximum), the grammar's
        refused tokens at 0."""
        logits = self.adjusted(logits if self.grammar is None else self._constrained(logits))
        out = np.zeros(len(logits))
        if self.params.temperature == 0.0:
            out[int(np.argmax(logits))] = 1.0
        else:
            order, probs = self._filtered(logits)
            out[order] = probs
        return out

    def _filtered(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens left by top-k, top-p and min-p, most likely first, and their probabilities at the temperature.

        min-p keeps the tokens whose probability at temperature 1 is at least min_p times the top one's (llama.cpp:
        a logit at least the top's + log(min_p)); top-p, before it in llama.cpp's chain, counts the mass before it."""
        p = self.params
        z = logits.astype(np.float64)
        order = top_first(z, p.top_k)
        # Shift before dividing: (z - max) / T is <= 0 and the top is exactly 0, so a tiny temperature
        # gives -inf for the rest and exp() stays finite (z / T first overflowed to inf - inf = NaN).
        with np.errstate(over="ignore"):
            z = (z[order] - z[order[0]]) / p.temperature
        probs = np.exp(z)
        probs /= probs.sum()
        if p.top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        if p.min_p > 0.0:
            raw = logits[order].astype(np.float64)
            keep = max(1, int(np.count_nonzero(raw >= raw[0] + math.log(p.min_p))))  # a prefix: sorted by logit
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return order, probs


def top_first(z: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest values (all of them when k is 0), largest first, ties by index: exactly
    np.argsort(-z, kind="stable")[:k]. Sorting a whole vocabulary took 3-4 ms a token on SmolLM2's 49,152
    tokens (a fifth of a token's time on the demo ring); partitioning first takes a tenth of that."""
    n = len(z)
    if not 0 < k < n or np.isnan(z).any():  # NaN logits: the full sort's order (NaN last) decides
        return np.argsort(-z, kind="stable")[: k or None]
    kth = np.partition(z, n - k)[n - k]  # the k-th largest value
    above = np.flatnonzero(z > kth)
    chosen = np.concatenate([above, np.flatnonzero(z == kth)[: k - len(above)]])
    return chosen[np.lexsort((chosen, -z[chosen]))]

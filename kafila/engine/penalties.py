"""What a request's own tokens and its logit_bias do to the logits, before any filter or temperature.

llama.cpp's default sampler chain starts with the logit bias, then the penalties, then top-k, top-p,
min-p and the temperature (common/sampling.cpp); the sampler follows that order, so greedy is the argmax
of these adjusted logits. Two kinds of penalty, each with its own definition:

- `repeat_penalty` (llama.cpp's, CTRL's with the negative-logit fix): a token among the last
  `repeat_last_n` tokens of prompt and reply has a positive logit divided by it, a negative one multiplied.
- `presence_penalty`, `frequency_penalty` (OpenAI's): logit -= presence * (count > 0) + frequency * count,
  count over the tokens of this reply so far (llama.cpp's server counts them in the same window of the
  prompt and reply as the repeat penalty; OpenAI's API, whose fields these are, counts the reply).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np

BAN = -100.0  # OpenAI: a bias of -100 bans the token (llama.cpp's server adds it: in effect the same)


class Shaping(Protocol):
    """The settings these need (sampler.SamplingParams has them)."""

    @property
    def presence_penalty(self) -> float: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def repeat_penalty(self) -> float: ...
    @property
    def repeat_last_n(self) -> int: ...
    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]: ...


class History:
    """The tokens the penalties count: the last repeat_last_n of prompt and reply, and the reply's counts."""

    def __init__(self, params: Shaping) -> None:
        self.params = params
        self._recent: deque[int] = deque(maxlen=params.repeat_last_n)
        self._reply: Counter[int] = Counter()

    @property
    def active(self) -> bool:
        """Whether anything changes the logits (not: they are used as they come, uncopied)."""
        p = self.params
        return bool(p.logit_bias) or p.presence_penalty != 0 or p.frequency_penalty != 0 or (
            p.repeat_penalty != 1.0 and p.repeat_last_n > 0)

    def prime(self, prompt: Sequence[int], reply: Sequence[int] = ()) -> None:
        """The prompt, and the reply so far (a resumed one's): as llama.cpp's server feeds its sampler the prompt."""
        self._recent.extend(prompt)
        for token in reply:
            self.accept(token)

    def accept(self, token: int) -> None:
        """One more token of the reply."""
        self._recent.append(token)
        self._reply[token] += 1

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """The logits with the bias and the penalties applied (float64; `logits` itself is never changed)."""
        p = self.params
        z = logits.astype(np.float64)  # a copy, always: a stage's row must not change under its owner
        for token, bias in p.logit_bias:
            z[token] = -np.inf if bias <= BAN else z[token] + bias
        if p.repeat_penalty != 1.0 and self._recent:
            seen = np.fromiter(set(self._recent), dtype=np.int64)
            z[seen] = np.where(z[seen] <= 0, z[seen] * p.repeat_penalty, z[seen] / p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self._reply:
            tokens = np.fromiter(self._reply.keys(), dtype=np.int64)
            counts = np.fromiter(self._reply.values(), dtype=np.float64)
            z[tokens] -= p.presence_penalty + p.frequency_penalty * counts
        return z

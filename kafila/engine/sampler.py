"""Token sampling from logits: greedy, or temperature with top-k and top-p, reproducible by seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler:
    """Samples one request's tokens; owns that request's random generator."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray) -> int:
        """The next token id for one row of logits."""
        p = self.params
        if p.temperature == 0.0:
            return int(np.argmax(logits))  # first maximum, as llama.cpp's greedy sampler
        z = logits.astype(np.float64) / p.temperature
        order = np.argsort(-z, kind="stable")
        if p.top_k:
            order = order[: p.top_k]
        z = z[order]
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[self._rng.choice(len(order), p=probs)])

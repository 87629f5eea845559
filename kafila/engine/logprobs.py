"""A reply token's log-probability and its most likely alternatives, as OpenAI's APIs list them.

The numbers are the log-softmax of the raw logits the token was sampled from: before the logit bias, the
penalties, the filters and the temperature, as llama.cpp's server reports them by default (its
`post_sampling_probs` false). OpenAI's chat shape is kept ({token, logprob, bytes, top_logprobs}); the
text-completion shape is made from it at the API (kafila/session/api/logprobs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kafila.engine.sampler import top_first
from kafila.engine.vocab import Vocab


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p for every token, in float64 (shifted by the maximum so that exp never overflows)."""
    z = logits.astype(np.float64)
    z -= z.max()
    return z - np.log(np.exp(z).sum())


def token_logprobs(vocab: Vocab, logits: np.ndarray, token: int, top: int) -> dict[str, Any]:
    """`token`'s entry: its text, log-probability and UTF-8 bytes, and the `top` most likely tokens' (ties by id)."""
    logp = log_softmax(logits)
    return {**_entry(vocab, token, logp), "top_logprobs": [_entry(vocab, int(t), logp) for t in top_first(logp, top)]
            if top else []}


def _entry(vocab: Vocab, token: int, logp: np.ndarray) -> dict[str, Any]:
    # a token may hold part of a character: its text shows U+FFFD there and `bytes` has the exact bytes
    piece = vocab.piece(token)
    return {"token": piece.decode("utf-8", "replace"), "logprob": float(logp[token]), "bytes": list(piece)}

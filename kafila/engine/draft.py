"""A draft model on the head's machine: a small GGUF sharing the target's vocabulary that guesses a request's next
tokens, one row a call, each request in its own KV-cache sequence (DESIGN §5b; prima.cpp's choice).

It keeps, per sequence, the tokens its cache holds; a draft first brings the cache to the request's tokens
(dropping what a rejected draft left, feeding what was accepted since), then decodes k tokens. The cache is
filled as the ring fills its own (the prompt in n_batch-row calls from its start, then one row a token), so
a model drafting for itself computes the ring's own numbers and is always right when greedy. Greedy
requests draft by argmax; sampled ones draw token i of the reply from the draft's own distribution with the
request's noise for token i (sampler.py), so the guess is the target's own draw whenever the two models
agree closely, and verification is a comparison.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kafila.engine.reference import ReferenceContext
from kafila.engine.request import common_prefix
from kafila.engine.sampler import Sampler
from kafila.engine.stage import ContextConfig, Rows
from kafila.engine.vocab import Vocab
from kafila.errors import EngineError
from kafila.model.gguf_file import GGUFFile


class DraftModel:
    """One llama.cpp context on a whole draft GGUF, drafting for any of the session's sequences."""

    def __init__(self, path: Path, config: ContextConfig) -> None:
        if not path.is_file():
            raise EngineError(f"the draft model {path} is not there")
        self.path, self.config = path, config
        self._ctx = ReferenceContext(path, config)
        self.vocab = Vocab(self._ctx.vocab, None)
        self._held: dict[int, list[int]] = {}
        self._times: deque[float] = deque(maxlen=32)

    def refusal(self, target: Vocab, target_path: Path, target_label: str | None = None) -> str | None:
        """Why this model cannot draft for the target (its vocabulary differs; both named), or None.

        `target_label`: the target as the session names it (a head's stage file is named by its hash)."""
        mine, theirs = self.vocab, target
        first = next((i for i in range(min(mine.n_tokens, theirs.n_tokens))
                      if mine.piece(i, special=True) != theirs.piece(i, special=True)), None)
        if first is None and mine.n_tokens == theirs.n_tokens:
            return None
        where = (f"token {first} is {mine.piece(first, True)!r} against {theirs.piece(first, True)!r}"
                 if first is not None else "one has more tokens")
        return (f"the draft model {_named(self.path, mine)} does not share the target's vocabulary "
                f"({_named(target_path, theirs, target_label)}): {where}")

    @property
    def step_s(self) -> float | None:
        """Median seconds a drafted token costs, its catching up included (None before any draft)."""
        return statistics.median(self._times) if self._times else None

    def draft(self, seq: int, prompt: Sequence[int], reply: Sequence[int], k: int,
              sampler: Sampler | None = None) -> list[int]:
        """k tokens guessed to follow the prompt and the reply so far in sequence `seq` (greedy, or drawn through
        `sampler` with the request's noise for each reply index)."""
        tokens = [*prompt, *reply]
        t0 = time.perf_counter()
        held = self._held.get(seq, [])
        keep = min(common_prefix(held, tokens), len(tokens) - 1)  # the last token is fed again: its logits are needed
        if keep < len(held):
            self._ctx.free(seq, keep)
        logits = self._feed(seq, tokens[keep:], keep, len(prompt))
        out: list[int] = []
        for i in range(k):
            token = int(np.argmax(logits)) if sampler is None else sampler.draw(logits, len(reply) + i)
            out.append(token)
            if i < k - 1:
                logits = self._feed(seq, [token], len(tokens) + i, 0)
        self._held[seq] = [*tokens, *out[:-1]]
        self._times.append((time.perf_counter() - t0) / max(k, 1))
        return out

    def _feed(self, seq: int, tokens: Sequence[int], start: int, prompt_len: int) -> np.ndarray:
        """Feed `tokens` from position `start`: prompt positions in calls ending at multiples of n_batch (or the
        prompt's end), the reply's one row a call; the last row's logits."""
        n_batch = self.config.n_batch
        logits = np.empty(0, np.float32)
        pos, end = start, start + len(tokens)
        while pos < end:
            stop = min((pos // n_batch + 1) * n_batch, prompt_len, end) if pos < prompt_len else pos + 1
            part = np.asarray(tokens[pos - start:stop - start], np.int32)
            n = len(part)
            rows = Rows(np.full(n, seq, np.int32), np.arange(pos, stop, dtype=np.int32), np.arange(n) == n - 1)
            logits = self._ctx.run(part, rows)[0]
            pos = stop
        return logits

    def close(self) -> None:
        self._ctx.close()


def _named(path: Path, vocab: Vocab, label: str | None = None) -> str:
    """A model's vocabulary as a person can tell it apart: its name, file, tokenizer and size."""
    meta = GGUFFile(path)
    name = meta.get("general.name") or "unnamed"
    tokenizer = meta.get("tokenizer.ggml.model") or "unknown"
    return f"{name} ({label or path.name}: {tokenizer} tokenizer, {vocab.n_tokens} tokens)"

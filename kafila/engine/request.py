"""One generation request as a state machine: which rows it needs next, and what it does with logits.

Transport-free, so the local chain and the ring scheduler drive requests the same way:
`take(budget)` hands out the next chunk (a prefill slice of the prompt, or the last sampled token),
`complete(logits)` consumes the logits of the chunk's last row when it asked for them.

Speculation: with a `drafter`, a decode step may carry drafted tokens after the last sampled one
(`Chunk.draft` of them); every row's logits come back, and the request keeps the drafted tokens its
own sampler agrees with, plus the sampler's token after them (DESIGN §5b). The sampler draws each token
from noise fixed by (seed, choice, token index) (sampler.py), and a draft model draws its guesses with the
same noise, so sampling the target's row and comparing is the whole verification: each token is the one
plain decoding draws, whatever was drafted and however the steps fell, and the reply is the same seed for
seed. The rows after the first disagreement are dropped from every stage's KV cache (`trim_from`).

Prefill chunks may be taken while earlier ones are still being computed (a ring pipelines one
prompt across its stages: every stage computes frames in the order the head sent them, so chunk
k+1 always follows chunk k into the KV cache); a decode step waits for the logits before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kafila.engine.logprobs import token_logprobs
from kafila.engine.sampler import Sampler
from kafila.engine.vocab import TextStream, Vocab
from kafila.errors import EngineError


@dataclass(frozen=True)
class Chunk:
    """Rows one request contributes to a stage call."""

    seq: int
    tokens: list[int]
    start_pos: int
    wants_logits: bool  # True when the last row's logits are needed for sampling
    draft: int = 0  # the last `draft` tokens are drafted: the logits of the last draft + 1 rows are needed

    @property
    def logit_rows(self) -> int:
        """How many rows' logits the chunk needs (its last ones)."""
        return self.draft + 1 if self.wants_logits else 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


MAX_DRAFT = 16  # drafted tokens one step may carry (a frame's u8 step field allows 255)


class Drafter(Protocol):
    """Proposes the tokens likely to follow a request's tokens (speculation.py, lookup.py)."""

    def draft(self, seq: int, prompt: Sequence[int], reply: Sequence[int], limit: int) -> list[int]:
        """At most `limit` tokens guessed to follow the prompt and the reply so far, in KV sequence `seq` (none:
        decode one token plainly)."""
        ...

    def verified(self, drafted: int, accepted: int) -> None:
        """How many of the last draft's tokens the target agreed with."""
        ...


@dataclass
class Request:
    """A prompt being completed in KV-cache sequence `seq`."""

    seq: int
    prompt: list[int]
    max_tokens: int
    n_ctx: int
    sampler: Sampler
    vocab: Vocab
    generated: list[int] = field(default_factory=list)
    fed: int = 0  # tokens whose rows have gone through the chain
    sent: int = 0  # tokens handed out by take(): fed, plus those still being computed
    pending: int = 0  # chunks handed out and not yet completed
    cached: int = 0  # prompt tokens whose KV cache an earlier request left (not computed again)
    finish_reason: str | None = None  # "stop" (end token or stop string), "length" (max tokens or context)
    stop: tuple[str, ...] = ()  # the text ends before the first of these strings (which is not returned)
    reuse_cache: bool = True  # False: no earlier request's KV cache is reused (llama-server's cache_prompt)
    # Chunk lengths the first prompt rows must go in: a reply cut by a lost member is rebuilt in the
    # chunks it was computed in (its prompt's, then one row per token), so its numbers come out the same.
    replay: list[int] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)  # the lengths of the prompt chunks handed out so far
    drafter: Drafter | None = None  # None: no speculation
    trim_from: int | None = None  # rejected rows from this position on are still in the stages' KV caches
    circuits: int = 0  # decode steps taken (each one trip round the ring), and their rows (drafted ones included)
    circuit_rows: int = 0
    logprobs: int | None = None  # set: each reply token's log-probability and this many top alternatives are kept
    token_logprobs: list[dict[str, Any]] = field(default_factory=list)  # one per token of `generated` (logprobs.py)

    def __post_init__(self) -> None:
        self.text = TextStream(self.vocab)
        self._held = ""  # text that may be the start of a stop string, kept back until it is known not to be
        if not self.prompt:
            raise EngineError("the prompt is empty")
        if len(self.prompt) >= self.n_ctx:
            raise EngineError(
                f"the prompt is {len(self.prompt)} tokens but the context holds {self.n_ctx}; "
                "shorten the prompt or raise --context"
            )

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def take(self, budget: int) -> Chunk | None:
        """The next rows to run (at most `budget`), or None when waiting or finished."""
        if self.done or budget <= 0:
            return None
        start = self.sent
        if start < len(self.prompt):
            n = budget
            if self.replay:
                if self.replay[0] > budget:
                    return None  # the next frame with room takes it (take_batch serves replays first)
                n = self.replay.pop(0)
            tokens = self.prompt[start : start + n]
            self.cuts.append(len(tokens))
            last, draft = start + len(tokens) == len(self.prompt), 0
        elif self.pending or not self.generated or self.trim_from is not None:
            return None  # the next token is being computed (or the rows of its rejected draft dropped)
        else:
            tokens = [self.generated[-1], *self._draft(start, budget)]
            last, draft = True, len(tokens) - 1
            self.circuits += 1
            self.circuit_rows += len(tokens)
        self.sent += len(tokens)
        self.pending += 1
        return Chunk(self.seq, tokens, start, last, draft)

    def _draft(self, start: int, budget: int) -> list[int]:
        """The drafter's tokens for a decode step at `start`: no more than the reply, the context and the frame
        hold (a verification keeps at most the draft plus one token)."""
        room = min(budget - 1, self.max_tokens - len(self.generated) - 1, self.n_ctx - 2 - start, MAX_DRAFT)
        if self.drafter is None or room <= 0:
            return []
        return self.drafter.draft(self.seq, self.prompt, self.generated, room)[:room]

    @property
    def replaying(self) -> bool:
        """Rows of a cut reply are still to be rebuilt in their recorded chunks."""
        return bool(self.replay) and not self.done

    @property
    def prefilling(self) -> bool:
        """Prompt rows are still to be handed out."""
        return self.sent < len(self.prompt)

    def reuse(self, cached: int) -> None:
        """Start after the first `cached` prompt tokens, whose KV cache the stages already hold."""
        if self.sent or not 0 <= cached < len(self.prompt):
            raise EngineError(f"cannot reuse {cached} cached tokens of a {len(self.prompt)}-token prompt")
        self.fed = self.sent = self.cached = cached

    @property
    def held(self) -> list[int]:
        """The tokens whose rows are in the KV cache (positions 0..fed-1)."""
        return (self.prompt + self.generated)[: self.fed]

    def complete(self, chunk: Chunk, logits: np.ndarray | None) -> str:
        """Record a finished chunk; with logits (one row, or a verification's draft + 1), sample the next
        token(s). Returns new text."""
        self.pending -= 1
        self.fed += len(chunk.tokens) - chunk.draft
        if not chunk.wants_logits:
            return ""
        if logits is None:
            raise EngineError("a chunk that wanted logits finished without them")
        if not chunk.draft:
            return self._sampled(self.sampler.sample(logits), logits)
        drafted = chunk.tokens[-chunk.draft:]
        piece, kept = "", 0
        for row in logits:
            token = self.sampler.sample(row)
            piece += self._sampled(token, row)
            if self.done or kept == len(drafted) or token != drafted[kept]:
                break
            kept += 1
            self.fed += 1  # the drafted token is the one sampled: its row's KV cache is the reply's
        if self.drafter is not None:
            self.drafter.verified(len(drafted), kept)
        if self.fed < self.sent:
            self.trim_from, self.sent = self.fed, self.fed
        return piece

    def trimmed(self) -> None:
        """The rejected rows are on their way out of every stage's cache (a trim went ahead of the next frame)."""
        self.trim_from = None

    def logprobs_since(self, start: int) -> dict[str, Any]:
        """The log-probabilities of the reply's tokens from `start` on, as {"logprobs": [...]}; {} when not asked."""
        return {} if self.logprobs is None else {"logprobs": self.token_logprobs[start:]}

    def _sampled(self, token: int, row: np.ndarray) -> str:
        """Take one sampled token (from logits `row`): the end, or the next token of the reply (text, less any
        stop string)."""
        if self.vocab.is_end(token):
            self.finish_reason = "stop"
            return self._stopped(self.text.flush())
        if self.logprobs is not None:
            self.token_logprobs.append(token_logprobs(self.vocab, row, token, self.logprobs))
        self.generated.append(token)
        self.sampler.accept(token)  # its penalties count it for the next token (a drafted one's row included)
        piece = self.text.push(token)
        if len(self.generated) >= self.max_tokens or self.fed + 1 >= self.n_ctx:
            self.finish_reason = "length"
            piece += self.text.flush()
        return self._stopped(piece)

    def _stopped(self, piece: str) -> str:
        """`piece` cut at the first stop string (which ends the request), less any tail that may begin one.

        As llama.cpp's completion does it: the text is searched, held text included, so a stop string
        split across tokens is found; a tail that could still grow into one is held back until it cannot.
        """
        if not self.stop:
            return piece
        text, self._held = self._held + piece, ""
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.finish_reason = "stop"
            return text[:min(cuts)]
        if self.done:
            return text
        keep = max((k for s in self.stop for k in range(1, min(len(s), len(text) + 1))
                    if text.endswith(s[:k])), default=0)
        if keep:
            text, self._held = text[:-keep], text[-keep:]
        return text

"""One generation request as a state machine: which rows it needs next, and what it does with logits.

Transport-free, so the local chain and the ring scheduler drive requests the same way:
`take(budget)` hands out the next chunk (a prefill slice of the prompt, or the last sampled token),
`complete(logits)` consumes the logits of the chunk's last row when it asked for them.

Prefill chunks may be taken while earlier ones are still being computed (a ring pipelines one
prompt across its stages: every stage computes frames in the order the head sent them, so chunk
k+1 always follows chunk k into the KV cache); a decode step waits for the logits before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
            last = start + len(tokens) == len(self.prompt)
        elif self.pending or not self.generated:
            return None  # the next token is being computed
        else:
            tokens = [self.generated[-1]]
            last = True
        self.sent += len(tokens)
        self.pending += 1
        return Chunk(self.seq, tokens, start, last)

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
        """Record a finished chunk; with logits, sample the next token. Returns new text."""
        self.pending -= 1
        self.fed += len(chunk.tokens)
        if not chunk.wants_logits:
            return ""
        if logits is None:
            raise EngineError("a chunk that wanted logits finished without them")
        token = self.sampler.sample(logits)
        if self.vocab.is_end(token):
            self.finish_reason = "stop"
            return self._stopped(self.text.flush())
        self.generated.append(token)
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

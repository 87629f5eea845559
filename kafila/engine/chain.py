"""The local chain: every stage of a split model in one process, run one after another (no network).

The head's block range is last, as in the ring: embedding rows → body stages → head stage → logits.
How requests share a call (`take_batch`, `pack`) and get their logits back (`logit_rows`) lives here
once: the ring's head batches the same way, and the exactness tests hold both to one llama.cpp
context fed the same batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kafila.engine.embedding import Embedder
from kafila.engine.request import Chunk, Request
from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.engine.vocab import Vocab
from kafila.errors import ModelError
from kafila.model.cut import StageSpec
from kafila.model.describe import describe_model
from kafila.model.gguf_file import GGUFFile
from kafila.model.stage_cache import StageCache


def parse_split(text: str | None, n_blocks: int) -> list[StageSpec]:
    """Stage specs from block boundaries such as "10,20" (→ [0,10) [10,20) [20,n)); the last is the head."""
    cuts = []
    for part in (text or "").replace(" ", "").split(","):
        if not part:
            continue
        try:
            cuts.append(int(part))
        except ValueError:
            raise ModelError(f"--split takes block numbers separated by commas, got '{part}'") from None
    bounds = [0, *cuts, n_blocks]
    for a, b in itertools.pairwise(bounds):
        if not a < b:
            raise ModelError(
                f"--split {text}: boundaries must increase strictly inside the model's {n_blocks} blocks "
                f"(each between 1 and {n_blocks - 1})"
            )
    return [StageSpec(a, b, head=(b == n_blocks)) for a, b in itertools.pairwise(bounds)]


def pack(chunks: list[Chunk]) -> tuple[np.ndarray, Rows]:
    """Tokens and row descriptions for several requests' chunks sharing one call (a drafted row in a
    step of its own: ubatch.py)."""
    tokens = np.concatenate([np.asarray(c.tokens, np.int32) for c in chunks])
    seq = np.concatenate([np.full(len(c.tokens), c.seq, np.int32) for c in chunks])
    pos = np.concatenate([np.arange(c.start_pos, c.start_pos + len(c.tokens), dtype=np.int32) for c in chunks])
    want = np.concatenate([np.arange(len(c.tokens)) >= len(c.tokens) - c.logit_rows for c in chunks])
    drafted = any(c.draft for c in chunks)
    step = np.concatenate([np.maximum(np.arange(len(c.tokens)) - (len(c.tokens) - c.draft - 1), 0)
                           for c in chunks]) if drafted else None
    return tokens, Rows(seq, pos, want, step)


@dataclass(frozen=True)
class Batch:
    """The chunks of several requests that share one call, packed."""

    requests: tuple[Request, ...]
    chunks: tuple[Chunk, ...]  # chunks[i] is requests[i]'s
    tokens: np.ndarray
    rows: Rows

    @property
    def decode_only(self) -> bool:
        """Every chunk is a generated token (no prompt rows)."""
        return all(c.start_pos >= len(r.prompt) for r, c in zip(self.requests, self.chunks, strict=True))


def take_batch(requests: Iterable[Request], budget: int) -> Batch | None:
    """The next chunk of every ready request, `budget` rows at most in all; None when none is ready.

    Decode steps go first and prompts fill what is left (chunked prefill): a long prompt then
    never holds back the other requests' next tokens. Only a reply being rebuilt after a loss goes
    before them: its recorded chunks must fit whole, and it holds its own tokens back meanwhile.
    """
    taken: list[tuple[Request, Chunk]] = []
    # stable: replaying, then decoding, then prefilling
    for r in sorted(requests, key=lambda r: 0 if r.replaying else 1 + r.prefilling):
        chunk = r.take(budget)
        if chunk is not None:
            taken.append((r, chunk))
            budget -= len(chunk.tokens)
    if not taken:
        return None
    chunks = tuple(c for _, c in taken)
    tokens, rows = pack(list(chunks))
    return Batch(tuple(r for r, _ in taken), chunks, tokens, rows)


def logit_rows(chunks: Iterable[Chunk], logits: np.ndarray) -> Iterator[tuple[Chunk, np.ndarray | None]]:
    """Each chunk with its row of `logits` (in order: one per chunk that wanted logits, a verification's draft +
    1 rows together), or None."""
    i = 0
    for chunk in chunks:
        n = chunk.logit_rows
        yield chunk, (None if not n else logits[i] if not chunk.draft else logits[i : i + n])
        i += n


class LocalChain:
    """All stages of one split in this process."""

    def __init__(
        self,
        source: Path,
        specs: list[StageSpec],
        config: ContextConfig,
        cache: StageCache,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.stages: list[StageEngine] = []
        try:
            for spec in specs:
                self.stages.append(StageEngine(cache.stage(source, spec, progress), config, final=spec.head))
        except BaseException:
            self.close()
            raise
        head_path = self.stages[-1].path
        self.embedder = Embedder(head_path)
        template = GGUFFile(head_path).get("tokenizer.chat_template")
        self.vocab = Vocab(self.stages[-1].vocab, template)

    def forward(self, tokens: np.ndarray, rows: Rows) -> np.ndarray:
        """Logits of the wanted rows, after every stage in order."""
        x = self.embedder.rows(tokens)
        for stage in self.stages:
            x = stage.run(x, rows)
        return x

    def step(self, requests: list[Request]) -> list[tuple[Request, str]]:
        """One call through the chain carrying a chunk of every ready request; returns new text."""
        batch = take_batch(requests, self.config.n_batch)
        if batch is None:
            return []
        logits = self.forward(batch.tokens, batch.rows)
        out = []
        for r, (c, row) in zip(batch.requests, logit_rows(batch.chunks, logits), strict=True):
            out.append((r, r.complete(c, row)))
            if r.done:
                self.free(r.seq)
            elif r.trim_from is not None:  # a draft's rejected rows
                self.free(r.seq, r.trim_from)
                r.trimmed()
        return out

    def run(self, requests: list[Request]) -> Iterator[tuple[Request, str]]:
        """Drive requests to completion, yielding text as it is produced."""
        while any(not r.done for r in requests):
            yield from self.step(requests)

    def free(self, seq: int, keep: int = 0) -> None:
        """Drop a sequence's KV cache on every stage from position `keep` on (0: all of it)."""
        for stage in self.stages:
            stage.free(seq, keep)

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
        self.stages = []


def open_chain(
    model: Path, split: str | None, config: ContextConfig, cache: StageCache,
    progress: Callable[[int, int], None] | None = None,
) -> LocalChain:
    """A LocalChain over `model` cut at `split` (block boundaries)."""
    info = describe_model(model)
    return LocalChain(model, parse_split(split, info.n_blocks), config, cache, progress)

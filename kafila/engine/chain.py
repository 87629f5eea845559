"""The local chain: every stage of a split model in one process, run one after another (no network).

The head's block range is last, as in the ring: embedding rows → body stages → head stage → logits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
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
    """Tokens and row descriptions for several requests' chunks sharing one call."""
    tokens = np.concatenate([np.asarray(c.tokens, np.int32) for c in chunks])
    seq = np.concatenate([np.full(len(c.tokens), c.seq, np.int32) for c in chunks])
    pos = np.concatenate([np.arange(c.start_pos, c.start_pos + len(c.tokens), dtype=np.int32) for c in chunks])
    want = np.concatenate([np.arange(len(c.tokens)) == len(c.tokens) - 1 if c.wants_logits
                           else np.zeros(len(c.tokens), bool) for c in chunks])
    return tokens, Rows(seq, pos, want)


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
        budget = self.config.n_batch
        taken: list[tuple[Request, Chunk]] = []
        for r in requests:
            chunk = r.take(budget)
            if chunk:
                taken.append((r, chunk))
                budget -= len(chunk.tokens)
        if not taken:
            return []
        tokens, rows = pack([c for _, c in taken])
        logits = self.forward(tokens, rows)
        out, i = [], 0
        for r, c in taken:
            row = None
            if c.wants_logits:
                row, i = logits[i], i + 1
            out.append((r, r.complete(c, row)))
            if r.done:
                self.free(r.seq)
        return out

    def run(self, requests: list[Request]) -> Iterator[tuple[Request, str]]:
        """Drive requests to completion, yielding text as it is produced."""
        while any(not r.done for r in requests):
            yield from self.step(requests)

    def free(self, seq: int) -> None:
        for stage in self.stages:
            stage.free(seq)

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

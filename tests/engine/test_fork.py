"""A sequence forked from another holds that sequence's prompt: a request in it goes on exactly as one that
computed the prompt itself (what lets a request's n choices share one prefill, head.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.engine.chain import LocalChain, logit_rows, open_chain, take_batch
from kafila.engine.request import Request
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.model.stage_cache import StageCache

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=256, n_seq_max=3, n_batch=64, n_threads=2)
MAX_TOKENS = 12


def _serve(chain: LocalChain, r: Request) -> list[np.ndarray]:
    """Drive one request to its end (its sequence kept); every logits row it sampled from."""
    rows = []
    while not r.done:
        batch = take_batch([r], CONFIG.n_batch)
        assert batch is not None
        for c, row in logit_rows(batch.chunks, chain.forward(batch.tokens, batch.rows)):
            if row is not None:
                rows.append(row)
            r.complete(c, row)
    return rows


def test_a_forked_sequence_goes_on_as_the_one_that_computed_the_prompt(smollm: Path,
                                                                       stage_cache: StageCache) -> None:
    chain = open_chain(smollm, "10,20", CONFIG, stage_cache)
    try:
        prompt = chain.vocab.chat_tokens([{"role": "user", "content": "Name three rivers in Europe."}])
        keep = len(prompt) - 1

        def request(seq: int, replay: list[int]) -> Request:
            return Request(seq, prompt, MAX_TOKENS, CONFIG.n_ctx_per_seq, Sampler(SamplingParams()), chain.vocab,
                           replay=replay)

        # the source: its prompt but the last token in one chunk, then the last one alone, as a fork's is
        source = request(0, [keep, 1])
        first = _serve(chain, source)
        # slot 2 holds another conversation first: the fork replaces it whole
        _serve(chain, Request(2, chain.vocab.tokenize("Once upon a time", add_special=True, parse_special=True),
                              MAX_TOKENS, CONFIG.n_ctx_per_seq, Sampler(SamplingParams()), chain.vocab))
        for seq in (1, 2):
            for stage in chain.stages:
                stage.fork(0, seq, keep)
            forked = request(seq, [])
            forked.reuse(keep)
            again = _serve(chain, forked)
            assert forked.generated == source.generated
            assert all(np.array_equal(a, b) for a, b in zip(again, first, strict=True))
        # without the fork the sequence holds nothing of the prompt: the same rows give other numbers
        chain.free(1)
        bare = request(1, [])
        bare.reuse(keep)
        assert not np.array_equal(_serve(chain, bare)[0], first[0])
    finally:
        chain.close()

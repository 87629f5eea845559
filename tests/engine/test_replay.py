"""A reply cut by a lost member, rebuilt in the chunks it was computed in, goes on token for token and bit for bit.

The rebuild feeds a fresh chain (a re-planned ring's stages hold nothing) each request's prompt in its
recorded chunks, then its tokens one row each, as they were first computed; the next logits must
equal the uninterrupted run's exactly. With one KV stream per sequence this holds alone and with four
requests sharing frames (their rows are computed apart from each other, engine/ubatch.py).
"""

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

CONFIG = ContextConfig(n_ctx_per_seq=512, n_seq_max=4, n_batch=64, n_threads=2)
TEXTS = ["Tell me a long story about a dragon who guards a library of forgotten books. " * 3,
         "What is the capital of France?", "Write a haiku about rivers.", "How do bees make honey?"]
MAX_TOKENS = 40
CUT = 15  # tokens each reply had when its member was lost


def _run(chain: LocalChain, requests: list[Request]) -> dict[int, list[np.ndarray]]:
    """Serve requests together to their end; every logits row each request sampled from, in order."""
    seen: dict[int, list[np.ndarray]] = {r.seq: [] for r in requests}
    while not all(r.done for r in requests):
        batch = take_batch(requests, CONFIG.n_batch)
        assert batch is not None
        for r, (c, row) in zip(batch.requests, logit_rows(batch.chunks, chain.forward(batch.tokens, batch.rows)),
                               strict=True):
            if row is not None:
                seen[r.seq].append(row)
            r.complete(c, row)
    return seen


def _request(chain: LocalChain, seq: int, prompt: list[int], max_tokens: int,
             replay: list[int] | None = None) -> Request:
    return Request(seq, prompt, max_tokens, CONFIG.n_ctx_per_seq, Sampler(SamplingParams()), chain.vocab,
                   reuse_cache=False, replay=list(replay or []))


@pytest.mark.parametrize("n", [1, 4], ids=["alone", "four-sharing-frames"])
def test_a_cut_reply_rebuilt_in_its_chunks_goes_on_bit_for_bit(smollm: Path, stage_cache: StageCache, n: int) -> None:
    first = open_chain(smollm, "10,20", CONFIG, stage_cache)
    try:
        prompts = [first.vocab.chat_tokens([{"role": "user", "content": t}]) for t in TEXTS[:n]]
        whole = [_request(first, s, p, MAX_TOKENS) for s, p in enumerate(prompts)]
        logits = _run(first, whole)
    finally:
        first.close()
    assert len(whole[0].cuts) > 1  # the long prompt went in several chunks (only prompt chunks are recorded)

    rebuilt = open_chain(smollm, "10,20", CONFIG, stage_cache)  # the re-planned ring: nothing cached
    try:
        # in other slots than before (reversed), as a re-planned head may give them
        resumed = [_request(rebuilt, n - 1 - s, p + r.generated[:CUT], MAX_TOKENS - CUT,
                            replay=r.cuts + [1] * CUT)
                   for s, (p, r) in enumerate(zip(prompts, whole, strict=True))]
        after = _run(rebuilt, resumed)
    finally:
        rebuilt.close()
    for s, (r, again) in enumerate(zip(whole, resumed, strict=True)):
        assert again.generated == r.generated[CUT:]
        assert all(np.array_equal(a, b) for a, b in zip(after[again.seq], logits[s][CUT:], strict=True))


def test_without_its_chunks_the_rebuild_is_another_computation(smollm: Path, stage_cache: StageCache) -> None:
    """Why the chunks are kept: prompt and reply prefilled in one go give other logits (DESIGN §2d)."""
    chain = open_chain(smollm, "10,20", CONFIG, stage_cache)
    try:
        prompt = chain.vocab.chat_tokens([{"role": "user", "content": TEXTS[1]}])
        r = _request(chain, 0, prompt, MAX_TOKENS)
        logits = _run(chain, [r])[0]
        again = _request(chain, 1, prompt + r.generated[:CUT], MAX_TOKENS - CUT)
        assert not np.array_equal(_run(chain, [again])[1][0], logits[CUT])
    finally:
        chain.close()

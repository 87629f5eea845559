"""A reply cut by a lost member, rebuilt in the chunks it was computed in, goes on token for token and bit for bit.

The rebuild feeds a fresh chain (a re-planned ring's stages hold nothing) each request's prompt in its
recorded chunks, then its tokens one row each, as they were first computed; the next logits must
equal the uninterrupted run's exactly, and every stage's KV cache for the request, saved at the cut, must
hold the same bytes as the uninterrupted stage's. With one KV stream per sequence this holds alone and with
four requests sharing frames (their rows are computed apart from each other, engine/ubatch.py).
"""

from __future__ import annotations

import struct
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


def _run(chain: LocalChain, requests: list[Request], cut: dict[int, int]
         ) -> tuple[dict[int, list[np.ndarray]], dict[int, list[bytes]]]:
    """Serve requests together to their end: every logits row each request sampled from, in order, and each
    stage's KV cache for a request (by slot) once `cut[slot]` of its tokens had gone through the chain."""
    seen: dict[int, list[np.ndarray]] = {r.seq: [] for r in requests}
    held: dict[int, list[bytes]] = {}
    while not all(r.done for r in requests):
        batch = take_batch(requests, CONFIG.n_batch)
        assert batch is not None
        for r, (c, row) in zip(batch.requests, logit_rows(batch.chunks, chain.forward(batch.tokens, batch.rows)),
                               strict=True):
            if row is not None:
                seen[r.seq].append(row)
            r.complete(c, row)
            if r.fed == cut[r.seq]:
                held[r.seq] = [stage.sequence_state(r.seq) for stage in chain.stages]
    return seen, held


def saved_cells(state: bytes) -> tuple[list[int], bytes]:
    """A sequence's saved KV cache (StageEngine.sequence_state) as its cells' positions and their K and V bytes:
    all but what names its slot (the sequence id, and which of the KV streams holds its cells).

    llama.cpp writes: magic, sequence id, the number of streams, then per stream its cell count, and for
    the one stream that holds the sequence its cells (position, sequence ids) and their K and V rows."""
    _magic, seq, n_stream = struct.unpack_from("<III", state)
    stream, off = 0, 12
    while (count := struct.unpack_from("<I", state, off)[0]) == 0:  # the streams before the one that holds it
        stream, off = stream + 1, off + 4
    off += 4
    positions = []
    for _ in range(count):
        pos, n_seq = struct.unpack_from("<iI", state, off)
        assert n_seq == 1 and struct.unpack_from("<i", state, off + 8)[0] == seq
        positions.append(pos)
        off += 12
    end = len(state) - 4 * (n_stream - 1 - stream)  # the later streams' counts, all 0
    assert state[end:] == bytes(len(state) - end)
    return positions, state[off:end]


def _request(chain: LocalChain, seq: int, prompt: list[int], max_tokens: int,
             replay: list[int] | None = None, sampling: SamplingParams | None = None,
             resume: list[int] | None = None) -> Request:
    sampler = Sampler(sampling or SamplingParams(), prompt[:len(prompt) - len(resume or [])], resume or [])
    return Request(seq, prompt, max_tokens, CONFIG.n_ctx_per_seq, sampler, chain.vocab,
                   reuse_cache=False, replay=list(replay or []))


@pytest.mark.parametrize("n", [1, 4], ids=["alone", "four-sharing-frames"])
def test_a_cut_reply_rebuilt_in_its_chunks_goes_on_bit_for_bit(smollm: Path, stage_cache: StageCache, n: int) -> None:
    first = open_chain(smollm, "10,20", CONFIG, stage_cache)
    try:
        prompts = [first.vocab.chat_tokens([{"role": "user", "content": t}]) for t in TEXTS[:n]]
        whole = [_request(first, s, p, MAX_TOKENS) for s, p in enumerate(prompts)]
        logits, held = _run(first, whole, {s: len(p) + CUT for s, p in enumerate(prompts)})
    finally:
        first.close()
    assert len(whole[0].cuts) > 1  # the long prompt went in several chunks (only prompt chunks are recorded)

    rebuilt = open_chain(smollm, "10,20", CONFIG, stage_cache)  # the re-planned ring: nothing cached
    try:
        # in other slots than before (reversed), as a re-planned head may give them
        resumed = [_request(rebuilt, n - 1 - s, p + r.generated[:CUT], MAX_TOKENS - CUT,
                            replay=r.cuts + [1] * CUT)
                   for s, (p, r) in enumerate(zip(prompts, whole, strict=True))]
        after, rebuilt_held = _run(rebuilt, resumed, {r.seq: len(r.prompt) for r in resumed})
    finally:
        rebuilt.close()
    for s, (r, again) in enumerate(zip(whole, resumed, strict=True)):
        assert again.generated == r.generated[CUT:]
        assert all(np.array_equal(a, b) for a, b in zip(after[again.seq], logits[s][CUT:], strict=True))
        # every stage, the middle one a lost member held included: the same positions and K/V bytes
        cells = [saved_cells(a) for a in held[s]]
        assert len(cells) == 3 and all(c[0] == list(range(len(r.prompt) + CUT)) for c in cells)
        assert cells == [saved_cells(b) for b in rebuilt_held[again.seq]]


def test_without_its_chunks_the_rebuild_is_another_computation(smollm: Path, stage_cache: StageCache) -> None:
    """Why the chunks are kept: prompt and reply prefilled in one go give other logits (DESIGN §2d)."""
    chain = open_chain(smollm, "10,20", CONFIG, stage_cache)
    try:
        prompt = chain.vocab.chat_tokens([{"role": "user", "content": TEXTS[1]}])
        r = _request(chain, 0, prompt, MAX_TOKENS)
        logits, held = _run(chain, [r], {0: len(prompt) + CUT})
        again = _request(chain, 1, prompt + r.generated[:CUT], MAX_TOKENS - CUT)
        after, again_held = _run(chain, [again], {1: len(again.prompt)})
        assert not np.array_equal(after[1][0], logits[0][CUT])
        assert saved_cells(held[0][1]) != saved_cells(again_held[1][1])  # a middle stage holds another KV cache
    finally:
        chain.close()


def test_a_cut_sampled_reply_goes_on_as_the_uncut_one_seed_for_seed(smollm: Path, stage_cache: StageCache) -> None:
    """At temperature 0.8 with a seed, the resumed request (its sampler given the reply so far, as the head gives
    it `resume`) draws each next token with the uncut reply's noise for it: the same tokens to the end."""
    sampling = SamplingParams(0.8, 40, 0.95, seed=20261207)
    chain = open_chain(smollm, "10,20", CONFIG, stage_cache)
    try:
        prompt = chain.vocab.chat_tokens([{"role": "user", "content": TEXTS[0]}])
        r = _request(chain, 0, prompt, MAX_TOKENS, sampling=sampling)
        _run(chain, [r], {0: -1})
        assert len(r.generated) == MAX_TOKENS  # long enough that the cut leaves many draws to go
        again = _request(chain, 1, prompt + r.generated[:CUT], MAX_TOKENS - CUT, replay=r.cuts + [1] * CUT,
                         sampling=sampling, resume=r.generated[:CUT])
        _run(chain, [again], {1: -1})
        assert again.generated == r.generated[CUT:]
        other = _request(chain, 2, prompt, MAX_TOKENS, sampling=SamplingParams(0.8, 40, 0.95, seed=7))
        _run(chain, [other], {2: -1})
        assert other.generated != r.generated  # the seed decides: the test could fail
    finally:
        chain.close()

"""A request's reply does not depend on its KV-cache slot or on what the other slots hold (DESIGN §2d).

With one KV stream for all slots, a fresh request's cells landed after the cells other slots kept, and
attention summed them in another order: "Name a river." answered llama.cpp's reply in slot 0 and
another in slots 1 and 2. Here every solo greedy reply, in every slot, before and after four requests
shared calls, must equal llama-cpp-python's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.engine.chain import LocalChain, logit_rows, open_chain, take_batch
from kafila.engine.request import Request
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.model.stage_cache import StageCache
from tests.conftest import llama_cpp_reply

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=512, n_seq_max=4, n_batch=64, n_threads=2)
PROMPT = "Name a river."
OTHERS = ["Write a haiku about rain.", "What is 12 times 7?", "List three colours.", "Say hello in French."]
MAX_TOKENS = 12


def _serve(chain: LocalChain, requests: list[Request]) -> list[str]:
    """Run requests together to their end (their caches stay in their slots, as the ring's slots keep them)."""
    texts = [""] * len(requests)
    while not all(r.done for r in requests):
        batch = take_batch(requests, CONFIG.n_batch)
        assert batch is not None
        logits = chain.forward(batch.tokens, batch.rows)
        for r, (c, row) in zip(batch.requests, logit_rows(batch.chunks, logits), strict=True):
            texts[requests.index(r)] += r.complete(c, row)
    return texts


def test_solo_greedy_reply_is_llama_cpps_in_every_slot(smollm: Path, stage_cache: StageCache) -> None:
    expected = llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)
    chain = open_chain(smollm, "10,20", CONFIG, stage_cache)

    def request(slot: int, text: str) -> Request:
        chain.free(slot)  # cache_prompt false: nothing of the slot's last request is reused
        return Request(slot, chain.vocab.chat_tokens([{"role": "user", "content": text}]), MAX_TOKENS,
                       CONFIG.n_ctx_per_seq, Sampler(SamplingParams()), chain.vocab)

    try:
        solo = [(slot, _serve(chain, [request(slot, PROMPT)])[0]) for slot in (0, 1, 2, 3, 0, 1)]
        # four different requests at once, in an order that cuts their calls unevenly, then solo again
        _serve(chain, [request(slot, text) for slot, text in zip((2, 0, 3, 1), OTHERS, strict=True)])
        solo += [(slot, _serve(chain, [request(slot, PROMPT)])[0]) for slot in (3, 1, 0, 2, 2, 3)]
    finally:
        chain.close()
    assert [(slot, text) for slot, text in solo if text != expected] == [], f"llama.cpp's reply: {expected!r}"

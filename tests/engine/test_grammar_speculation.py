"""Drafted tokens under a grammar, through a local chain of real stages: a drafted token the sampler agrees with
advances the grammar like a sampled one, a rejected one never does, so a constrained greedy reply is the same
whatever was drafted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafila.engine.chain import LocalChain, open_chain
from kafila.engine.grammar import Grammar, schema_grammar
from kafila.engine.request import Request
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.model.stage_cache import StageCache
from tests.engine.test_speculation_exact import Scripted

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=64)
PROMPT = "Describe a famous programmer as JSON."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "languages": {"type": "array", "items": {"type": "string"},
                                                         "maxItems": 3}},
          "required": ["name", "languages"], "additionalProperties": False}


@pytest.fixture(scope="module")
def chain(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalChain]:
    c = open_chain(smollm, "10,20", CONFIG, StageCache(tmp_path_factory.mktemp("stages")))
    yield c
    c.close()


def run(chain: LocalChain, drafter: Any = None) -> tuple[list[int], str]:
    tokens = chain.vocab.chat_tokens([{"role": "user", "content": PROMPT}])
    sampler = Sampler(SamplingParams(0.0), tokens, grammar=Grammar(chain.vocab, schema_grammar(SCHEMA)))
    r = Request(0, tokens, 80, CONFIG.n_ctx_per_seq, sampler, chain.vocab, drafter=drafter)
    text = "".join(piece for _, piece in chain.run([r]))
    chain.free(0)
    assert r.finish_reason == "stop", text
    return r.generated, text


def test_drafted_tokens_advance_the_grammar_only_when_kept(chain: LocalChain) -> None:
    tokens, text = run(chain)
    start = len(chain.vocab.chat_tokens([{"role": "user", "content": PROMPT}]))
    truth = Scripted(start, tokens)  # every drafted token kept: each must advance the grammar
    assert run(chain, truth) == (tokens, text) and truth.accepted > len(tokens) / 3
    space = chain.vocab.tokenize(" ", add_special=False)[0]
    wrong = Scripted(start, wrong=space)  # a token the grammar allows in many places, drafted at every step
    assert run(chain, wrong) == (tokens, text) and wrong.drafted > wrong.accepted

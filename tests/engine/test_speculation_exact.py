"""Speculation is exact: with drafted tokens verified one row a call and the rejected rows trimmed, a reply is
the one plain decoding gives (llama.cpp's own, greedy), at temperature 0.8 too, seed for seed, whatever the
drafter proposes: prompt lookup, the true continuation (the ceiling), or tokens that are always wrong."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from kafila.engine.chain import LocalChain, open_chain
from kafila.engine.draft import DraftModel
from kafila.engine.request import MAX_DRAFT, Request
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.errors import EngineError
from kafila.model.stage_cache import StageCache
from kafila.session.ring.speculation import Speculator
from tests.conftest import llama_cpp_reply
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=64)
MAX_TOKENS = 48
EDIT = ("Fix the spelling mistakes in this paragraph and write the corrected paragraph:\n\nThe quick brwon fox "
        "jumpd over the lazzy dog while the farmer wachted from the feild.")
FREE = "Name a river."
LONG = "Explain how a bicycle works."  # a reply longer than MAX_TOKENS


@pytest.fixture(scope="module")
def chain(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> LocalChain:
    c = open_chain(smollm, "10,20", CONFIG, StageCache(tmp_path_factory.mktemp("stages")))
    yield c
    c.close()


class Scripted:
    """A drafter proposing `script`'s tokens after the request's first `start` tokens (or always `wrong`)."""

    def __init__(self, start: int, script: Sequence[int] = (), wrong: int | None = None) -> None:
        self.start, self.script, self.wrong = start, list(script), wrong
        self.drafted = self.accepted = self.steps = 0

    def q(self, i: int) -> None:
        return None

    def draft(self, seq: int, prompt: Sequence[int], reply: Sequence[int], limit: int) -> list[int]:
        tokens = [*prompt, *reply]
        self.steps += 1
        if self.wrong is not None:
            return [self.wrong] * limit
        done = len(tokens) - self.start
        return self.script[done:done + min(limit, 4)]

    def verified(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted


def reply(chain: LocalChain, prompt: str, drafter: object = None, temperature: float = 0.0) -> tuple[str, Request]:
    tokens = chain.vocab.chat_tokens([{"role": "user", "content": prompt}])
    r = Request(0, tokens, MAX_TOKENS, CONFIG.n_ctx_per_seq, Sampler(SamplingParams(temperature, 40, 0.95, 11)),
                chain.vocab, drafter=drafter)  # type: ignore[arg-type]
    text = "".join(piece for _, piece in chain.run([r]))
    chain.free(0)
    return text, r


@pytest.mark.parametrize("prompt", [EDIT, FREE])
def test_lookup_drafts_give_llama_cpps_greedy_reply(chain: LocalChain, smollm: Path, prompt: str) -> None:
    speculator = Speculator("lookup", lambda: (0.120, 0.009))  # 40 ms links: worth drafting
    text, _ = reply(chain, prompt, speculator.drafter())
    assert text == llama_cpp_reply(smollm, prompt, MAX_TOKENS, CONFIG.n_ctx_per_seq)
    assert speculator.drafted > 0
    if prompt == EDIT:  # the reply copies the paragraph: most drafted tokens are the target's own
        assert speculator.accepted > speculator.drafted / 2, speculator.as_dict()


def test_at_temperature_the_reply_is_the_plain_one_seed_for_seed(chain: LocalChain) -> None:
    plain, _ = reply(chain, EDIT, temperature=0.8)
    speculator = Speculator("lookup", lambda: (0.120, 0.009))
    drafted, _ = reply(chain, EDIT, speculator.drafter(), temperature=0.8)
    assert drafted == plain and speculator.accepted > 0


def test_the_true_continuation_is_all_accepted_and_wrong_drafts_all_trimmed(chain: LocalChain) -> None:
    plain, r = reply(chain, EDIT)
    start = len(r.prompt)
    oracle = Scripted(start, r.generated)
    text, _ = reply(chain, EDIT, oracle)
    assert text == plain and oracle.accepted == oracle.drafted > 0
    assert oracle.steps <= len(r.generated) / 4 + 2  # four drafted and one sampled token a step
    wrong = Scripted(start, wrong=0)  # token 0 never follows here: every draft is rejected and trimmed
    text, _ = reply(chain, EDIT, wrong)
    assert text == plain and wrong.accepted == 0 and wrong.drafted >= len(r.generated)


@pytest.fixture(scope="module")
def own_draft(smollm: Path) -> DraftModel:
    d = DraftModel(smollm, CONFIG)
    yield d
    d.close()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_model_drafting_for_itself_is_always_right_and_changes_no_token(
        chain: LocalChain, smollm: Path, own_draft: DraftModel, temperature: float) -> None:
    # the machinery's ceiling: the target as its own draft, its cache filled as the ring fills its own, so it
    # computes the ring's very numbers: greedy, every drafted token is the target's; sampled, it draws with the
    # request's own noise from the target's own distribution, so every guess is kept (only a draft running past
    # the reply's end loses its tail), and the reply is the plain one seed for seed
    # a circuit of a second outside compute: the longest draft is worth its cost for any draft step under a
    # second, so the draft lengths, and the circuits counted below, do not hang on this machine's load
    speculator = Speculator("draft", lambda: (1.0, 0.009), model=own_draft)
    sampling = SamplingParams(temperature, 40, 0.95, 11)
    text, r = reply(chain, LONG, speculator.drafter(sampling=sampling), temperature)
    plain, _ = reply(chain, LONG, temperature=temperature)
    assert text == plain
    if temperature == 0:
        assert plain == llama_cpp_reply(smollm, LONG, MAX_TOKENS, CONFIG.n_ctx_per_seq)
    ended = r.finish_reason == "stop"
    assert speculator.drafted > 0 and speculator.accepted >= speculator.drafted - (MAX_DRAFT if ended else 0), \
        speculator.as_dict()
    assert r.circuits <= len(r.generated) / 3  # several tokens a circuit
    assert own_draft.step_s is not None and own_draft.step_s > 0


def test_a_sampled_reply_is_the_plain_one_whatever_the_draft_model_guesses(
        chain: LocalChain, own_draft: DraftModel) -> None:
    # a draft drawing from another distribution than the target's (the same model at temperature 1.6 with no
    # top-p: a weaker draft, as a small model beside a large one is): some guesses are rejected, and each
    # reply token is still the one plain decoding draws with that index's noise, so the reply is the plain
    # one seed for seed (drafter-invariant, sampler.py), and so the same through a resume or another ring
    speculator = Speculator("draft", lambda: (1.0, 0.009), model=own_draft)
    sampling = SamplingParams(0.8, 40, 0.95, 11)
    drafter = speculator.drafter(sampling=sampling)
    assert drafter is not None and drafter.sampler is not None
    drafter.sampler = Sampler(SamplingParams(1.6, 0, 1.0, 11))
    text, r = reply(chain, LONG, drafter, 0.8)
    plain, _ = reply(chain, LONG, temperature=0.8)
    assert text == plain
    assert 0 < speculator.accepted < speculator.drafted and r.circuits < len(r.generated), speculator.as_dict()


def test_a_draft_model_of_another_vocabulary_is_refused_naming_both(own_draft: DraftModel, smollm: Path,
                                                                    tmp_path: Path) -> None:
    other_path = write_synthetic(tmp_path / "other.gguf", "llama")
    other = DraftModel(other_path, CONFIG)
    try:
        why = other.refusal(own_draft.vocab, smollm)
    finally:
        other.close()
    assert why is not None and "other.gguf" in why and smollm.name in why and "49152 tokens" in why, why
    assert own_draft.refusal(own_draft.vocab, smollm) is None
    with pytest.raises(EngineError, match="is not there"):
        DraftModel(tmp_path / "deleted.gguf", CONFIG)

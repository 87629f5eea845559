"""The head's speculation modes: who drafts for a request, and how long a draft is from the ring's costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.engine.draft import DraftModel
from kafila.engine.sampler import SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.errors import EngineError
from kafila.session.ring.speculation import MODEL, Speculator

pytestmark = pytest.mark.fast

FAR = (0.120, 0.009)  # a circuit's network seconds and one compute step: 40 ms links


@pytest.fixture(scope="module")
def draft(smollm: Path) -> DraftModel:
    d = DraftModel(smollm, ContextConfig(n_ctx_per_seq=256, n_seq_max=1, n_batch=64))
    yield d
    d.close()


def test_who_drafts_in_each_mode(draft: DraftModel) -> None:
    plain = Speculator("auto", lambda: FAR)
    assert plain.drafter("off") is None
    lookup = plain.drafter()
    assert lookup is not None and lookup.model is None  # no draft model here: lookup
    with_model = Speculator("auto", lambda: FAR, model=draft)
    assert (d := with_model.drafter()) is not None and d.model is draft and d.sampler is None
    assert (d := with_model.drafter("lookup")) is not None and d.model is None
    assert plain.drafter("draft") is None  # `draft` without a draft model: plain decoding
    sampled = with_model.drafter("draft", SamplingParams(0.8, 40, 0.95, 3))
    assert sampled is not None and sampled.sampler is not None  # a sampled request's draft draws from q
    with pytest.raises(ValueError, match="speculation mode"):
        Speculator("sometimes", lambda: FAR)


def test_no_draft_before_the_ring_has_measured_a_step_nor_where_it_cannot_pay() -> None:
    unmeasured = Speculator("lookup", lambda: None)
    assert unmeasured.length(3, 8, "lookup") == 0
    near = Speculator("auto", lambda: (0.0005, 0.009))  # a circuit all compute: drafted rows never pay
    assert near.length(3, 8, "auto") == 0
    assert near.length(3, 8, "lookup") == 1  # forced: one token at least
    far = Speculator("auto", lambda: FAR)
    for _ in range(20):
        far.acceptance[MODEL].add(8, 8)  # a draft model that is always right
    assert far.length(MODEL, 16, "auto", draft_s=0.005) == 16


def test_a_draft_model_that_fails_leaves_drafting_to_lookup_and_the_reply_to_go_on(draft: DraftModel) -> None:
    def failing(fn: object) -> object:
        raise EngineError("llama_decode failed on 1 rows")

    speculator = Speculator("auto", lambda: FAR, model=draft, compute=failing)
    forced = speculator.drafter("draft")
    for _ in range(20):
        speculator.acceptance[MODEL].add(8, 8)
    drafter = speculator.drafter()
    assert drafter is not None
    tokens = [1, 2, 3, 4, 1, 2, 3]
    assert drafter.draft(0, tokens, [], 8) == []  # no draft this step, and no error
    assert speculator.model is None and "failed" in (speculator.model_note or "")
    assert speculator.as_dict()["draft_note"] == speculator.model_note
    for _ in range(20):
        speculator.acceptance[3].add(8, 8)
    assert drafter.draft(0, tokens[:4], tokens[4:], 8) == [4, 1, 2, 3]  # auto: by lookup from now on
    assert forced is not None and forced.draft(0, tokens[:4], tokens[4:], 8) == []  # `draft`: plainly

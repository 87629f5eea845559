"""Speculation at the head: each request drafts by prompt lookup or with the draft model on this machine, and
each step's draft length comes from the ring's measured costs and the acceptance seen so far
(planner/speculation.py).

Modes (`--speculate`, or a request's own `speculate`): `off`; `lookup` and `draft`, which draft whenever
they can (at least one token; `draft` without a draft model, none given or one lost, decodes plainly);
`auto` (the default), which drafts with the draft model when there is one, else by lookup, and only when
the expected tokens per second beat a plain step: on a ring whose circuits cost little beside its compute
it stays off.
Acceptance is counted over the session (recent drafts weigh more), per lookup match length (a
one-token match is a weaker guess than a three-token one) and for the draft model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kafila.engine.draft import DraftModel
from kafila.engine.lookup import LONGEST, Lookup
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.stage import ContextConfig
from kafila.engine.vocab import Vocab
from kafila.errors import EngineError
from kafila.planner.speculation import best_draft
from kafila.session.protocol.fields import SPECULATION_MODES as MODES

log = logging.getLogger("kafila.head")
NO_DRAFT = "decoding plainly (--speculate draft) or drafting by lookup (auto)"  # what the head does without one
DECAY = 0.98  # each verification's weight against the ones before: about the last 50 count
MODEL = 0  # the draft model's key in Speculator.acceptance (lookup's are match lengths 1..LONGEST)


@dataclass
class Acceptance:
    """Accepted and tried drafted tokens, decayed: alpha, from a prior of one of each."""

    accepted: float = 1.0
    tried: float = 2.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.tried

    def add(self, drafted: int, kept: int) -> None:
        # a verification tried the drafted tokens up to and including the first rejected one
        self.accepted = self.accepted * DECAY + kept
        self.tried = self.tried * DECAY + kept + (kept < drafted)


def _inline(fn: Callable[[], Any]) -> Any:
    return fn()


@dataclass
class Speculator:
    """The head's speculation: its mode, the acceptance per drafter, the ring's costs, the draft model.

    `costs` returns (seconds of a circuit outside compute, seconds of one compute step round the ring),
    or None before the ring has measured a decode step; `others` how many other requests share frames;
    `compute` runs the draft model's calls (on the stage's own llama.cpp thread).
    """

    mode: str
    costs: Callable[[], tuple[float, float] | None]
    others: Callable[[], int] = lambda: 0
    model: DraftModel | None = None
    compute: Callable[[Callable[[], Any]], Any] = _inline
    acceptance: dict[int, Acceptance] = field(default_factory=lambda: {n: Acceptance() for n in
                                                                        range(LONGEST + 1)})
    drafted: int = 0
    accepted: int = 0
    model_note: str | None = None  # why a draft model asked for is not used

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def drafter(self, mode: str | None = None, sampling: SamplingParams | None = None) -> RequestDrafter | None:
        """A new request's drafter in `mode` (None: the session's), or None when speculation is off."""
        mode = mode or self.mode
        if mode == "off" or (mode == "draft" and self.model is None):
            return None
        if self.model is None or mode == "lookup":
            return RequestDrafter(self, mode)
        sampler = None
        if sampling is not None and sampling.temperature > 0:
            # the request's own seed and choice: the draft's guess for token i is drawn with the target's noise for
            # it (sampler.py); the guess itself needs no penalties
            sampler = Sampler(replace(sampling, presence_penalty=0.0, frequency_penalty=0.0, repeat_penalty=1.0,
                                      logit_bias=()))
        return RequestDrafter(self, mode, model=self.model, sampler=sampler)

    def drop_model(self, why: str) -> None:
        """Draft by lookup from now on (the model stays open until the stage closes: a draft may be running)."""
        log.warning("%s", why)
        self.model, self.model_note = None, why

    def length(self, key: int, candidates: int, mode: str, draft_s: float = 0.0) -> int:
        """How many of `candidates` tokens the next step should carry, drafted by `key` (a lookup match
        length, or MODEL) at `draft_s` seconds a drafted token."""
        costs = self.costs()
        if costs is None:
            return 0
        network_s, step_s = costs
        return best_draft(self.acceptance[key].alpha, candidates, network_s, step_s, self.others(),
                          at_least=0 if mode == "auto" else 1, draft_s=draft_s)

    def as_dict(self) -> dict[str, object]:
        """The session's speculation figures."""
        return {"mode": self.mode, "drafted": self.drafted, "accepted": self.accepted,
                "draft_model": None if self.model is None else self.model.path.name, "draft_note": self.model_note,
                "draft_step_s": None if self.model is None else self.model.step_s}


@dataclass
class RequestDrafter:
    """One request's drafting: its lookup index, or its draft-model sequence, as its Speculator decides."""

    speculator: Speculator
    mode: str
    model: DraftModel | None = None
    sampler: Sampler | None = None  # a sampled request's draft sampler (None: greedy drafts)
    lookup: Lookup = field(default_factory=Lookup)
    drafted: int = 0  # this request's drafted tokens, and how many of them were kept
    accepted: int = 0
    drafting_s: float = 0.0  # the draft model's time on this request's drafts
    _key: int = 0  # who drafted the last draft (Speculator.acceptance)

    def draft(self, seq: int, prompt: Sequence[int], reply: Sequence[int], limit: int) -> list[int]:
        s = self.speculator
        if self.model is not None and s.model is None:  # the draft model failed since this request began
            if self.mode != "auto":
                return []  # `draft`: plain decoding
            self.model = None
        if self.model is not None:
            model = self.model
            # before the first draft its step is unknown: guessed at a ring step's
            k = s.length(MODEL, limit, self.mode, model.step_s or (s.costs() or (0.0, 0.0))[1])
            if not k:
                return []
            self._key = MODEL
            t0 = time.perf_counter()
            try:
                out = s.compute(lambda: model.draft(seq, prompt, reply, k, self.sampler))
            except EngineError as exc:  # a draft model that fails drafts no more: the reply goes on without it
                s.drop_model(f"the draft model failed ({exc}); {NO_DRAFT}")
                return []
            finally:
                self.drafting_s += time.perf_counter() - t0
            return list(out)
        match = self.lookup.match([*prompt, *reply], limit)
        if match is None or not match.tokens:
            return []
        self._key = match.n
        return match.tokens[: s.length(match.n, len(match.tokens), self.mode)]

    def verified(self, drafted: int, accepted: int) -> None:
        s = self.speculator
        s.acceptance[self._key].add(drafted, accepted)
        for counts in (self, s):
            counts.drafted += drafted
            counts.accepted += accepted


def load_draft(path: Path, config: ContextConfig, vocab: Vocab, stage: Path,
               model: str) -> tuple[DraftModel | None, str]:
    """This machine's draft model for the head's speculation, and the log's line. When it cannot be used (not
    there, not loadable, another vocabulary than the stage `stage` of `model`) the line says why, and the head
    decodes plainly (`draft`) or drafts by lookup (`auto`): no reply fails. Blocking: run it off the loop."""
    try:
        draft = DraftModel(path, config)
    except EngineError as exc:
        return None, f"no draft model: {exc}; {NO_DRAFT}"
    why = draft.refusal(vocab, stage, model)
    if why is None:
        return draft, f"the head drafts with {path.name}"
    draft.close()
    return None, f"draft model refused: {why}; {NO_DRAFT}"

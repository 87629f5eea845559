"""The settings every member of a session must agree on: one frozen object, sent in every assignment.

A host's options are of two kinds. Some say how its own process runs (its name, address, cache, threads, API
port, how long it waits for members at the start). The others say how the *session* runs, and must hold
whoever coordinates it: they are this object. The coordinator sends it in each `assign`
(kafila.session.protocol.messages), and a member that takes coordination over (member/takeover.py) runs with
the one its last assignment carried, unchanged. Rebuilding it field by field there once dropped `--speculate`,
`--no-replan`, `--no-copy` and `--stall-limit` (issue 55): a new setting added here travels by itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SessionSettings:
    """How the session runs, on every coordinator it has (the CLI's names in the comments)."""

    context: int = 2048  # --context: tokens of context per request (llama.cpp's n_ctx_per_seq)
    concurrency: int = 4  # --concurrency: requests served at once, each in a KV-cache sequence (n_seq_max)
    batch: int = 128  # --batch: most rows per call; prompts go round the ring in chunks of this many (n_batch)
    speculate: str = "auto"  # --speculate: the head's speculation, auto, lookup, draft or off (ring/speculation.py)
    replan: bool = True  # not --no-replan: after losing a member, plan again over the others when the model fits
    copy: bool = True  # not --no-copy: give a member a copy of the model when no other holds it (model_copy.py)
    stall_s: float = 120.0  # --stall-limit: a member showing no progress this long before admission is lost
    # --measure-wait: for each member that arrived to measure its machine, from when its measurement began
    measure_wait_s: float = 900.0
    mixed_builds: bool = False  # --mixed-builds: admit members whose llama.cpp build differs (not bit-exact then)
    strategy: str = "kafila"  # which split to serve: "kafila", or a baseline ("uniform", "memory") for benchmarks
    chat_template: str | None = None  # --chat-template: a Jinja chat template (its text) in place of the model's
    # --source: public URLs of the model file (and the Hugging Face URL it came from): members fetch their stages'
    # chunks there, each checked against the coordinator's manifest, and the coordinator sends only the rest
    sources: tuple[str, ...] = ()

    @property
    def config(self) -> dict[str, int]:
        """The llama.cpp context settings every stage uses (engine.stage.ContextConfig's names)."""
        return {"n_ctx_per_seq": self.context, "n_seq_max": self.concurrency, "n_batch": self.batch}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

"""A session's phases and the only ways from one to the next: one table (issue 55, item 3).

The coordinator and every member keep a phase in their SessionState (the TUI, the API's `/kafila/state` and
the API server's waiting all read it); every change goes through `SessionState.set_phase`, which checks it
here. The paths an honest session takes:

    member       starting ─► measuring ⇄ waiting ─► delivering ─► connecting ─► admitted
                                                        ▲  ▲           │            │
                                                        │  └───────────┘            │  (a new assignment:
                                                        └───────────────────────────┘   re-planned or lost)
    coordinator  starting ─► waiting ─► planning ─► delivering ─► connecting ─► admitted ─► planning ...
                                │          └─► rejected                          (a drift or an arrival)
                                └─► admitted  (a member took a serving ring over: takeover.py, adopt)
                 connecting ─► planning  (an edge broke and both its ends answer: everyone planned again)
    either       any ─► lost ─► planning | delivering  (re-planned without the lost member)
                 any ─► closed;  any but closed ─► rejected  (the coordinator's reject or refusal, at any time)

An illegal change is a bug: it raises in tests (KAFILA_STRICT_PHASES=1, set by tests/conftest.py, reaches
the processes they start too) and is logged in production, where the phase still changes (a dashboard
showing a surprising phase beats a session stopped over it).
"""

from __future__ import annotations

import os

PHASES = ("starting", "waiting", "measuring", "planning", "delivering", "connecting",
          "admitted", "rejected", "lost", "closed")

# phase -> the phases it may change to, besides itself and ANYWHERE (pure data: the diagram above)
TRANSITIONS: dict[str, frozenset[str]] = {
    "starting": frozenset({"waiting", "measuring"}),
    "waiting": frozenset({"measuring", "planning", "delivering", "admitted"}),
    "measuring": frozenset({"waiting"}),
    "planning": frozenset({"delivering", "rejected"}),
    "delivering": frozenset({"connecting"}),
    "connecting": frozenset({"admitted", "delivering", "planning"}),
    "admitted": frozenset({"planning", "delivering"}),
    "lost": frozenset({"planning", "delivering"}),
    "rejected": frozenset(),
    "closed": frozenset(),
}
ANYWHERE = frozenset({"lost", "closed"})  # a session can fail or end in any phase
BEFORE_THE_END = frozenset({"rejected"})  # ... and be rejected (or refused) in any but a closed one
STRICT_ENV = "KAFILA_STRICT_PHASES"


class IllegalTransition(AssertionError):
    """A phase change the table does not allow: a bug in the session code, never a peer's doing."""


def illegal(current: str, new: str) -> str | None:
    """Why changing from `current` to `new` is not allowed (None: it is)."""
    if new not in TRANSITIONS:
        return f"{new!r} is not a phase (one of {', '.join(PHASES)})"
    if new == current or new in ANYWHERE or new in TRANSITIONS.get(current, frozenset()):
        return None
    if new in BEFORE_THE_END and current != "closed":
        return None
    return f"the phase cannot change from {current!r} to {new!r}"


def strict_from_env() -> bool:
    """Whether an illegal change raises (tests) or is logged (production)."""
    return os.environ.get(STRICT_ENV) == "1"

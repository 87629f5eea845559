"""The head's KV-cache slots and what each still holds: a finished request's cache stays for the next turn.

Each slot is one KV-cache sequence on every stage. When a request ends, its slot keeps the tokens
whose rows went through the ring; a new request takes the idle slot whose tokens share the longest
prefix with its prompt and prefills only the rest (as llama-server's prompt cache does). With no
prefix in common it takes an empty slot, else evicts the least recently used one. The slots are the
admitted concurrency, so the plan's memory reservation (n_seq_max × n_ctx_per_seq) is unchanged.

A slot's cache is reused only by requests of the client it served (its owner: the member whose API the
request came through, whose token only that machine's user holds): how many tokens were cached, and the
time to first token, would otherwise tell one user the longest prefix they share with another's
conversation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from kafila.engine.request import common_prefix


@dataclass(frozen=True)
class Taken:
    """A slot given to a request: its first `keep` prompt tokens are cached; positions from `keep` on
    must be dropped from the slot (`trim`) before the request's rows go in."""

    slot: int
    keep: int
    trim: bool


@dataclass
class Slots:
    """Idle slots (with the tokens each holds) and when each was last used; busy slots are in neither."""

    idle: dict[int, tuple[int, ...]]
    used: dict[int, int] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)  # whose request each idle slot's cache holds
    _clock: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def empty(cls, n: int) -> Slots:
        return cls({s: () for s in range(n)})

    def __bool__(self) -> bool:
        return bool(self.idle)

    def cached(self, prompt: Sequence[int], reuse: bool = True, owner: str = "") -> int:
        """How many of `prompt`'s tokens `take` would find cached (0 when no slot is idle)."""
        return self.take(prompt, reuse, owner, peek=True).keep if self.idle else 0

    def take(self, prompt: Sequence[int], reuse: bool = True, owner: str = "", peek: bool = False) -> Taken:
        """The idle slot for `prompt`: longest common prefix among `owner`'s slots, else an empty slot, else the
        least recently used. Without `reuse` (or from another owner) the slot's cache is dropped whole (keep 0)."""
        def shared(s: int) -> int:
            return common_prefix(self.idle[s], prompt) if reuse and self.owners.get(s, "") == owner else 0

        def rank(s: int) -> tuple[int, bool, int]:
            return shared(s), not self.idle[s], -self.used.get(s, -1)

        slot = max(self.idle, key=rank)
        # at least the prompt's last token is computed again: its logits give the first reply token
        keep = min(shared(slot), len(prompt) - 1)
        if peek:
            return Taken(slot, keep, False)
        held = self.idle.pop(slot)
        self.owners.pop(slot, None)
        return Taken(slot, keep, keep < len(held))

    def put(self, slot: int, tokens: Sequence[int] = (), owner: str = "") -> None:
        """`slot` is idle again, its KV cache holding `tokens` (positions 0..len-1) of `owner`'s request."""
        self.idle[slot] = tuple(tokens)
        self.used[slot] = next(self._clock)
        self.owners[slot] = owner


def sharer(prompt: Sequence[int], owner: str, reuse: bool, active: dict[int, tuple[Sequence[int], str, bool]]
           ) -> tuple[int, int]:
    """The busy slot whose prompt shares the longest prefix with `prompt`, and how many tokens a fork from it would
    give (at most all but the prompt's last token, whose logits give the first reply token); (-1, 0) when none.

    `active`: each busy slot's prompt, owner and whether its request reuses caches. Only the same owner's requests
    share, for the reason slots are kept per owner (the module's docstring), and only requests that reuse caches:
    one with cache_prompt false computes its prompt afresh, as one context would, each of its n choices too."""
    best, most = -1, 0
    if not reuse:
        return best, most
    for slot, (theirs, who, their_reuse) in active.items():
        n = min(common_prefix(theirs, prompt), len(prompt) - 1) if who == owner and their_reuse else 0
        if n > most:
            best, most = slot, n
    return best, most

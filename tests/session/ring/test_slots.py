"""The head's slot choice against brute force: longest common prefix, else an empty slot, else the LRU one."""

from __future__ import annotations

import random

import pytest

from kafila.session.ring.slots import Slots, Taken, common_prefix, sharer

pytestmark = pytest.mark.fast


def brute_choice(idle: dict[int, tuple[int, ...]], used: dict[int, int], prompt: list[int]) -> int:
    def lcp(a: tuple[int, ...]) -> int:
        return max((n for n in range(min(len(a), len(prompt)) + 1) if list(a[:n]) == prompt[:n]), default=0)

    best = max(lcp(t) for t in idle.values())
    if best > 0:
        candidates = [s for s, t in idle.items() if lcp(t) == best]
    else:
        candidates = [s for s, t in idle.items() if not t] or list(idle)
    return min(candidates, key=lambda s: used.get(s, -1))  # ties: the least recently used


@pytest.mark.parametrize("seed", range(200))
def test_choice_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    slots = Slots.empty(4)
    for _ in range(rng.randint(0, 6)):  # some history: slots taken and put back holding tokens
        if not slots:
            break
        taken = slots.take([rng.randint(0, 3) for _ in range(rng.randint(1, 8))])
        slots.put(taken.slot, [rng.randint(0, 3) for _ in range(rng.randint(0, 8))])
    if not slots:
        return
    prompt = [rng.randint(0, 3) for _ in range(rng.randint(1, 8))]
    idle, used = dict(slots.idle), dict(slots.used)
    expected = brute_choice(idle, used, prompt)
    taken = slots.take(prompt)
    assert taken.slot == expected
    held = idle[taken.slot]
    assert taken.keep == min(common_prefix(held, prompt), len(prompt) - 1)
    assert taken.trim == (taken.keep < len(held))
    assert taken.slot not in slots.idle


def test_a_whole_cached_prompt_still_computes_its_last_token() -> None:
    slots = Slots.empty(1)
    slots.put(0, [1, 2, 3, 4, 5])
    taken = slots.take([1, 2, 3])
    assert (taken.slot, taken.keep, taken.trim) == (0, 2, True)


def test_a_follow_up_turn_keeps_everything_it_shares() -> None:
    slots = Slots.empty(2)
    slots.put(1, [7, 8, 9])
    taken = slots.take([7, 8, 9, 10, 11])
    assert (taken.slot, taken.keep, taken.trim) == (1, 3, False)


def test_without_reuse_the_slot_is_emptied_and_a_cache_is_not_chosen_for_its_prefix() -> None:
    """`cache_prompt: false`: an empty slot is preferred to one sharing the prompt's prefix, and a slot that
    holds tokens is trimmed whole (keep 0), so the whole prompt is computed afresh."""
    slots = Slots.empty(2)
    slots.put(slots.take([1, 2, 3]).slot, [1, 2, 3, 9])
    empty = next(s for s, held in slots.idle.items() if not held)
    taken = slots.take([1, 2, 3, 4], reuse=False)
    assert (taken.slot, taken.keep, taken.trim) == (empty, 0, False)
    taken = slots.take([1, 2, 3, 4], reuse=False)  # only the slot holding [1, 2, 3, 9] is left
    assert (taken.keep, taken.trim) == (0, True)


def test_a_slots_cache_is_reused_only_by_its_owner() -> None:
    # issue 34 item 11: cached_tokens (and the time to first token) told one member's user the longest
    # prefix they shared with another's conversation
    slots = Slots.empty(2)
    first = slots.take([1, 2, 3, 4], owner="ada")
    slots.put(first.slot, [1, 2, 3, 4, 9], owner="ada")
    theirs = slots.take([1, 2, 3, 5], owner="bo")
    assert theirs.keep == 0  # bo's guess 1, 2, 3 learns nothing: no slot of bo's holds it
    slots.put(theirs.slot, [1, 2, 3, 5], owner="bo")
    again = slots.take([1, 2, 3, 4, 7], owner="ada")
    assert (again.slot, again.keep, again.trim) == (first.slot, 4, True)  # ada's own cache, as before
    assert slots.take([1, 2, 3, 5, 6], owner="bo") == Taken(theirs.slot, 4, False)


def test_a_request_shares_the_longest_prompt_a_busy_slot_of_its_owner_holds() -> None:
    prompt = [1, 2, 3, 4, 5]
    active = {0: ((1, 2, 9), "me", True), 1: ((1, 2, 3, 4, 5), "me", True), 2: ((1, 2, 3, 4, 5, 6), "you", True)}
    assert sharer(prompt, "me", True, active) == (1, 4)  # all but the last token: its logits give the first reply
    assert sharer(prompt, "them", True, active) == (-1, 0)  # another owner's prompt is never shared
    # cache_prompt false computes the prompt afresh: it neither shares nor is shared
    assert sharer(prompt, "me", False, active) == (-1, 0)
    assert sharer(prompt, "me", True, {3: ((1, 2, 3, 4, 5), "me", False)}) == (-1, 0)
    assert Slots.empty(2).cached(prompt, True, "me") == 0 and Slots({}).cached(prompt) == 0

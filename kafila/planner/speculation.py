"""How many drafted tokens a decode step should carry: the expected tokens per circuit over its time.

A circuit of the ring costs `network_s` (every edge's delay and the per-hop software, measured) plus
one compute step per row of the request (`step_s`: a drafted row is a one-row call of its own on every
stage, DESIGN §5b), and a draft model's step per drafted token (`draft_s`; lookup costs nothing).
With each drafted token accepted with probability `alpha` (independently, the usual approximation),
k drafted tokens give 1 + alpha + ... + alpha^k tokens a circuit. Requests sharing the frame
(`others`, one token each) wait for the extra steps too, so the choice maximises the frame's tokens
per second, not the one request's.
"""

from __future__ import annotations


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one circuit yields with k drafted tokens, each accepted with probability `alpha`."""
    return sum(alpha**i for i in range(k + 1))


def best_draft(alpha: float, candidates: int, network_s: float, step_s: float, others: int = 0,
               at_least: int = 0, draft_s: float = 0.0) -> int:
    """The number of drafted tokens (0..candidates) that maximises the frame's tokens per second.

    `at_least` (at most `candidates`): a floor, for a mode that always speculates when it can."""
    def rate(k: int) -> float:
        return (others + expected_tokens(alpha, k)) / (network_s + (k + 1) * step_s + k * draft_s)

    floor = min(at_least, candidates)
    return max(range(floor, candidates + 1), key=rate)

"""`kafila bench rendezvous` at a small scale (issue 56): the fill stops at the bound that binds, and what the
table counts for a session is not far from what it holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kafila.bench.rendezvous_fill import MEMBERS, fill_table, largest_announcement, measure_sample
from kafila.bench.rendezvous_memory import rendezvous_memory, summary
from kafila.net.trust import MAX_ANNOUNCEMENT
from rendezvous.limits import Limits
from rendezvous.state import MEMBER_BYTES, SESSION_BYTES, announcement_bytes

pytestmark = pytest.mark.fast

ANN = "Q" * largest_announcement()
COUNTED = SESSION_BYTES + MEMBERS * (MEMBER_BYTES + announcement_bytes(ANN))  # a full session, as the table counts it


def test_the_largest_announcement_is_at_least_a_real_members_largest() -> None:
    sealed = 4 * -(-(1 + 12 + MAX_ANNOUNCEMENT + 16) // 3)  # version, nonce, body, tag; in base64: 1,240
    assert sealed <= len(ANN) < Limits().max_datagram


def test_a_fill_stops_at_the_bytes_bound() -> None:
    limits = replace(Limits(), max_table_bytes=2 << 20)
    full = fill_table(limits, ANN)
    assert full["bound"] == "bytes" and full["refused"] == "full"
    room = limits.max_table_bytes - full["table_bytes"]
    assert 0 <= room < MEMBER_BYTES + announcement_bytes(ANN)  # not even one more member fits
    assert full["sessions"] == -(-limits.max_table_bytes // COUNTED)  # the last one cut short by the bound
    assert (full["sessions"] - 1) * MEMBERS < full["members"] < full["sessions"] * MEMBERS


def test_a_fill_stops_at_the_sessions_bound() -> None:
    full = fill_table(replace(Limits(), max_sessions=12), ANN)
    assert full["bound"] == "sessions" and full["sessions"] == 12 and full["members"] == 12 * MEMBERS
    assert full["counted_bytes_per_session"] == COUNTED


def test_a_session_holds_less_than_the_table_counts_but_not_far_less() -> None:
    # small caches, which the warm-up fills: their bounds, not these sessions, decide what the caches hold; and a
    # sample as long as the warm-up, so that each of the table's dicts grows once in it (amortized, not a spike)
    small = replace(Limits(), max_buckets=64, max_cached_replies=64)
    sample = measure_sample(small, ANN, warmup=24, sessions=24, spent=True)  # the largest records: nonces spent
    assert 0.3 < sample["held_over_counted"] <= 1.0, sample


def test_the_bench_measures_in_fresh_processes() -> None:
    r = rendezvous_memory(replace(Limits(), max_table_bytes=1 << 20), sample=4, warmup=4)
    full = r["full"]
    assert full["bound"] == "bytes" and full["sessions"] == 18
    assert full["rss_kb"] >= full["rss_before_kb"] > 0 and full["peak_rss_kb"] >= full["rss_kb"]
    assert r["sample"]["counted_bytes_per_session"] == COUNTED
    assert "18 sessions (bytes bound)" in summary(r)

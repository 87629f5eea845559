"""`kafila bench grammar`'s arithmetic and registration (the run itself is a benchmark, not a test)."""

from __future__ import annotations

import argparse

import pytest

from kafila.bench.grammar import FORMAT, _summary
from kafila.commands import bench
from kafila.session.ring.chat_request import parse_chat

pytestmark = pytest.mark.fast


def test_the_mean_is_weighted_by_the_gaps_between_tokens() -> None:
    runs = [{"tokens": 11, "mean_ms": 10.0, "median_ms": 9.0}, {"tokens": 31, "mean_ms": 20.0, "median_ms": 19.0},
            {"tokens": 1, "mean_ms": None, "median_ms": None}]
    s = _summary(runs)
    assert s["replies"] == 2 and s["tokens"] == 42 and s["mean_ms_per_token"] == pytest.approx(17.5)
    assert s["median_ms_per_token"] == 14.0


def test_it_is_registered_and_its_schema_is_accepted() -> None:
    p = argparse.ArgumentParser()
    bench.configure(p)
    args = p.parse_args(["grammar", "--rounds", "1", "--tokens", "8"])
    assert (args.bench, args.rounds, args.tokens) == ("grammar", 1, 8)
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "response_format": FORMAT}).grammar

"""The benchmarks' chat (kafila.bench.replies) against the real API server, its ring scripted."""

from __future__ import annotations

import time

import pytest

from kafila.bench.replies import chat, greedy_reply
from tests.tui.scripted_api import STATS, Script, start

pytestmark = pytest.mark.fast


async def test_chat_keeps_text_notices_stats_and_first_text_time() -> None:
    script = Script(notices={1: "member bo was lost"}, delay_s=0.05)
    server, url = await start(script)
    try:
        t0 = time.perf_counter()
        r = await chat(url, "hi", 8)
        whole_s = time.perf_counter() - t0
    finally:
        await server.stop()
    assert r.text == "Hello, ring!" and r.notices == ["member bo was lost"]
    assert r.stats["tokens_per_s"] == STATS["tokens_per_s"] and r.stats["finish_reason"] == "stop"
    # the first piece comes before the scripted delays, the last after three more (sleeps never end early)
    assert r.first_text_s is not None and 0 < r.first_text_s <= whole_s - 3 * script.delay_s
    sent = script.requests[0]
    assert sent["temperature"] == 0 and sent["max_tokens"] == 8 and "cache_prompt" not in sent  # the server's default


async def test_a_reply_without_text_has_no_first_text_time() -> None:
    script = Script(pieces=[])
    server, url = await start(script)
    try:
        r = await chat(url, "hi", 8)
    finally:
        await server.stop()
    assert r.text == "" and r.first_text_s is None and r.stats["finish_reason"] == "stop"


async def test_greedy_reply_computes_the_prompt_afresh_and_passes_extra_fields() -> None:
    script = Script()
    server, url = await start(script)
    try:
        r = await greedy_reply(url, "hi", 8, speculate="off")
    finally:
        await server.stop()
    assert r["text"] == "Hello, ring!" and r["notices"] == [] and r["network_share"] == STATS["network_share"]
    sent = script.requests[0]
    assert sent["cache_prompt"] is False and sent["speculate"] == "off"

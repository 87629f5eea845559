"""A request's events as the head streams them: text held and sent several tokens to a piece."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

# Text goes out at most this often, several tokens to a piece: a message per token kept the host, the
# client and the head's event loop busy while the next token was computing (on a shared machine,
# stealing the cores that stage ran on); 20 updates a second still read as a live stream.
STREAM_INTERVAL_S = 0.05


async def paced(events: asyncio.Queue[dict[str, Any]]) -> AsyncGenerator[dict[str, Any], None]:
    """`events` until the first "done" or "error"; "delta" events are joined and sent at most every
    STREAM_INTERVAL_S, and text held goes out before any other event."""
    pending, sent_at = "", -STREAM_INTERVAL_S
    tokens: list[int] = []
    extra: dict[str, Any] = {}  # a delta's prompt_cuts (once a request) and logprobs go out with the joined piece
    while True:
        wait = sent_at + STREAM_INTERVAL_S - time.perf_counter() if pending or tokens else None
        try:
            async with asyncio.timeout(None if wait is None else max(wait, 0.0)):
                evt = await events.get()
        except TimeoutError:
            evt = {}  # the held text is due
        if "delta" in evt:
            pending += evt["delta"]
            tokens += evt["tokens"]
            extra |= {k: v for k, v in evt.items() if k == "prompt_cuts"}
            if "logprobs" in evt:  # one entry per token, joined as the tokens are
                extra["logprobs"] = extra.get("logprobs", []) + evt["logprobs"]
            if time.perf_counter() - sent_at < STREAM_INTERVAL_S:
                continue
        if pending or tokens:
            yield {"delta": pending, "tokens": tokens, **extra}
            pending, tokens, extra, sent_at = "", [], {}, time.perf_counter()
        if "progress" in evt:
            yield evt
        if "done" in evt or "error" in evt:
            yield evt
            return

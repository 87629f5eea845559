"""A request's `n` choices as one stream of events: each choice travels to the head as a request of its own
(its own KV sequence there, its prompt forked from the first one's), and its events come back tagged with
its `index`; the stream ends when every choice has, or at the first error."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any


async def merged(streams: list[AsyncGenerator[dict[str, Any], None]]) -> AsyncGenerator[dict[str, Any], None]:
    """The choices' events as they come, each with "index"; closing this closes every choice's stream (its
    request at the head is then freed)."""
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[dict[str, Any], None]) -> None:
        try:
            async with contextlib.aclosing(stream) as events:
                async for evt in events:
                    queue.put_nowait({**evt, "index": index})
        except Exception as exc:  # one choice's failure ends the whole request with it, as an error event
            queue.put_nowait({"error": f"choice {index} failed: {exc}", "index": index})
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            evt = await queue.get()
            if evt is None:
                left -= 1
                continue
            yield evt
            if "error" in evt:
                return
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def usage(dones: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's `usage` for a request's choices: the prompt counted once, every choice's reply tokens."""
    def count(done: dict[str, Any], name: str) -> int:
        value = done.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    first = dones.get(min(dones)) if dones else {}
    prompt = count(first or {}, "prompt_tokens")
    completion = sum(count(d, "completion_tokens") for d in dones.values())
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if first and isinstance(first.get("cached_tokens"), int):  # OpenAI's field: prompt tokens a KV cache held
        out["prompt_tokens_details"] = {"cached_tokens": first["cached_tokens"]}
    return out

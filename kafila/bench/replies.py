"""A benchmark's greedy reply through a session's API, held against llama-cpp-python's own."""

from __future__ import annotations

from typing import Any


async def greedy_reply(url: str, prompt: str, tokens: int, **extra: Any) -> dict[str, Any]:
    """One greedy chat, its prompt computed afresh (`cache_prompt` off: a reused prefix may change a greedy
    reply): its text, the notices it carried (a new plan cut it) and the head's final figures; `extra`: more
    body fields (`speculate`)."""
    from kafila.session.api.client import ApiClient, Notice, ReplyStats

    text, notices, stats = [], [], {}
    async with ApiClient(url, read_timeout=600) as api:
        async for item in api.stream_chat([{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0,
                                          extra={**extra, "cache_prompt": False}):
            if isinstance(item, str):
                text.append(item)
            elif isinstance(item, Notice):
                notices.append(item.text)
            elif isinstance(item, ReplyStats):
                stats = dict(item.raw)
    return {"text": "".join(text), "notices": notices, **stats}

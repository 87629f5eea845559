"""A benchmark's chat through a session's API: one greedy reply, streamed and kept whole."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    """One streamed reply: its text, the notices it carried (a new plan cut it), the head's final figures and
    the seconds from sending it to its first text (None: it had no text)."""

    text: str
    notices: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    first_text_s: float | None = None


async def chat(url: str, prompt: str, tokens: int, *, cache_prompt: bool = True, read_timeout: float = 600,
               **extra: Any) -> Reply:
    """One greedy chat of one user message; `cache_prompt` off computes the prompt afresh (a reused prefix may
    change a greedy reply); `extra`: more body fields (`speculate`)."""
    from kafila.session.api.client import ApiClient, Notice, ReplyStats

    text: list[str] = []
    reply = Reply("")
    body = extra | ({} if cache_prompt else {"cache_prompt": False})
    t0 = time.perf_counter()
    async with ApiClient(url, read_timeout=read_timeout) as api:
        async for item in api.stream_chat([{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0,
                                          extra=body or None):
            if isinstance(item, str) and item:
                if reply.first_text_s is None:
                    reply.first_text_s = time.perf_counter() - t0
                text.append(item)
            elif isinstance(item, Notice):
                reply.notices.append(item.text)
            elif isinstance(item, ReplyStats):
                reply.stats = dict(item.raw)
    reply.text = "".join(text)
    return reply


async def greedy_reply(url: str, prompt: str, tokens: int, **extra: Any) -> dict[str, Any]:
    """A reply held against llama-cpp-python's own (its prompt computed afresh): its text, its notices and the
    head's final figures, in one dict."""
    r = await chat(url, prompt, tokens, cache_prompt=False, **extra)
    return {"text": r.text, "notices": r.notices, **r.stats}

"""How the head's events become OpenAI's answers: one object, or Server-Sent Events ending `data: [DONE]`.

The events (kafila.session.ring.head.Head.chat): {"delta": text, "tokens": ids, "logprobs"?: entries},
{"notice": text},
{"progress": {"prefilled", "prompt_tokens"}}, {"done": stats} or {"error": message, "status"?,
"param"?, "code"?}. A chat is answered with chat.completion objects, a text completion with
text_completion ones (`Shape`); both carry the head's stats as an extra "kafila" block.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kafila.engine.chat.parse import Call, parse
from kafila.engine.chat.stream import CallSplitter
from kafila.session.api.guard import error_response
from kafila.session.api.logprobs import chat_logprobs, text_logprobs


@dataclass(frozen=True)
class Shape:
    """How one endpoint answers: OpenAI's chat.completion objects, or text_completion's."""

    chat: bool

    @property
    def prefix(self) -> str:
        return "chatcmpl" if self.chat else "cmpl"

    def whole(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def chunk(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def logprobs(self, entries: list[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
        """The choice's `logprobs` (None: not asked for); `offset`: the reply's characters before these tokens."""
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else text_logprobs(entries, offset)

    def choice(self, text: str, finish: str | None, logprobs: list[dict[str, Any]] | None = None,
               calls: tuple[Call, ...] = ()) -> dict[str, Any]:
        """A whole reply's one choice; with `calls`, OpenAI's tool_calls (content null when there is none)."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                message["tool_calls"] = tool_calls(calls)
            return {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else finish,
                    "logprobs": self.logprobs(logprobs)}
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": self.logprobs(logprobs)}

    def delta(self, text: str | None, finish: str | None, logprobs: list[dict[str, Any]] | None = None,
              offset: int = 0) -> dict[str, Any]:
        """A streamed chunk's one choice: a piece of text (None: the closing chunk, no text) and its tokens'
        log-probabilities when asked for."""
        if self.chat:
            out = {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
            return out | ({} if logprobs is None else {"logprobs": self.logprobs(logprobs)})
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": self.logprobs(logprobs, offset)}


CHAT, TEXT = Shape(chat=True), Shape(chat=False)


def tool_calls(calls: tuple[Call, ...]) -> list[dict[str, Any]]:
    """OpenAI's tool_calls; each gets an id `call_…` unless the model wrote its own (Mistral's, which its
    template wants back as it was)."""
    return [{"id": c.id or f"call_{secrets.token_hex(12)}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


async def whole(shape: Shape, base: dict[str, Any], first: dict[str, Any],
                events: AsyncIterator[dict[str, Any]], logprobs: bool = False) -> web.Response:
    """A non-streamed reply: every event gathered into one chat.completion (or text_completion)."""
    text, notices, done = [], [], None
    entries: list[dict[str, Any]] | None = [] if logprobs else None
    fmt = None
    async for evt in chain(first, events):
        fmt = evt.get("tool_format", fmt)
        if "error" in evt:
            return event_error(evt)
        if "delta" in evt:
            text.append(evt["delta"])
            if entries is not None:
                entries += evt.get("logprobs", [])
        if "notice" in evt:
            notices.append(evt["notice"])
        done = evt.get("done", done)
    done = {**(done or {}), **({"notices": notices} if notices else {})}
    reply = parse(fmt, "".join(text)) if fmt else None  # a chat with tools: its calls read from the text
    choice = (shape.choice(reply.content, done.get("finish_reason"), entries, reply.calls) if reply is not None
              else shape.choice("".join(text), done.get("finish_reason"), entries))
    return web.json_response({**base, "object": shape.whole(), "choices": [choice], "usage": _usage(done),
                              "kafila": done})


async def stream(request: web.Request, shape: Shape, base: dict[str, Any], first: dict[str, Any],
                 events: AsyncIterator[dict[str, Any]], include_usage: bool, logprobs: bool = False
                 ) -> web.StreamResponse:
    """A streamed reply as Server-Sent Events: OpenAI's chunk objects of the endpoint's shape, then [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    base = {**base, "object": shape.chunk()}

    async def send(obj: dict[str, Any] | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await resp.write(f"data: {data}\n\n".encode())

    if shape.chat:  # a chat stream opens with the speaker's role
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    sent = 0  # characters of the reply sent so far (a text completion's text_offset)
    calls: CallSplitter | None = None  # a chat with tools: text that may become a call is held back
    async for evt in chain(first, events):
        if "tool_format" in evt:  # once: a reply resumed on a new ring is told again
            calls = calls or CallSplitter(evt["tool_format"])
        elif evt.get("delta") or (logprobs and evt.get("logprobs")):  # a held piece's tokens go with their numbers
            entries = evt.get("logprobs", []) if logprobs else None
            piece = calls.push(evt["delta"]) if calls is not None else evt["delta"]
            if piece or entries:
                await send({**base, "choices": [shape.delta(piece, None, entries, sent)]})
            sent += len(piece)
        elif "notice" in evt:  # no text: a line for the reader (clients that do not know it skip it)
            await send({**base, "choices": [], "kafila": {"notice": evt["notice"]}})
        elif "progress" in evt:  # a long prompt's prefill so far, likewise without choices
            await send({**base, "choices": [], "kafila": {"progress": evt["progress"]}})
        elif "error" in evt:
            await send({"error": _error_body(evt)})
            break
        elif "done" in evt:
            done = evt["done"]
            finish = done.get("finish_reason")
            if calls is not None:
                rest = calls.finish()
                if rest.content:
                    await send({**base, "choices": [shape.delta(rest.content, None)]})
                if rest.calls:
                    await send({**base, "choices": [tool_delta(rest.calls)]})
                    finish = "tool_calls"
            await send({**base, "choices": [shape.delta(None, finish)], "kafila": done})
            if include_usage:
                await send({**base, "choices": [], "usage": _usage(done)})
    await send("[DONE]")
    await resp.write_eof()
    return resp


def tool_delta(calls: tuple[Call, ...]) -> dict[str, Any]:
    """A streamed chunk's choice carrying whole calls (OpenAI's tool-call deltas, each at its index)."""
    return {"index": 0, "delta": {"tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls(calls))]},
            "finish_reason": None}


async def chain(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for evt in rest:
        yield evt


def _usage(done: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = done.get("prompt_tokens"), done.get("completion_tokens")
    prompt = prompt if isinstance(prompt, int) else 0
    completion = completion if isinstance(completion, int) else 0
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    cached = done.get("cached_tokens")
    if isinstance(cached, int):  # OpenAI's field: prompt tokens an earlier turn's KV cache held
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _error_body(evt: dict[str, Any]) -> dict[str, Any]:
    status = _event_status(evt)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"message": str(evt["error"]), "type": kind, "param": evt.get("param"), "code": evt.get("code")}


def _event_status(evt: dict[str, Any]) -> int:
    """A head's refusal carries its status (400); every other failure of the ring is a 502."""
    status = evt.get("status")
    return status if isinstance(status, int) and 400 <= status <= 599 else 502


def event_error(evt: dict[str, Any]) -> web.Response:
    body = _error_body(evt)
    return error_response(_event_status(evt), body["message"], body["param"], body["code"])

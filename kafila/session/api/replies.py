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
from kafila.session.api.choices import usage
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
               calls: tuple[Call, ...] = (), index: int = 0) -> dict[str, Any]:
        """A whole reply's choice number `index`; with `calls`, OpenAI's tool_calls (content null when there is
        none)."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                message["tool_calls"] = tool_calls(calls)
            return {"index": index, "message": message, "finish_reason": "tool_calls" if calls else finish,
                    "logprobs": self.logprobs(logprobs)}
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": self.logprobs(logprobs)}

    def delta(self, text: str | None, finish: str | None, logprobs: list[dict[str, Any]] | None = None,
              offset: int = 0, index: int = 0) -> dict[str, Any]:
        """A streamed chunk's choice number `index`: a piece of text (None: the closing chunk, no text) and its
        tokens' log-probabilities when asked for."""
        if self.chat:
            out = {"index": index, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
            return out | ({} if logprobs is None else {"logprobs": self.logprobs(logprobs)})
        return {"index": index, "text": text or "", "finish_reason": finish,
                "logprobs": self.logprobs(logprobs, offset)}


CHAT, TEXT = Shape(chat=True), Shape(chat=False)


def tool_calls(calls: tuple[Call, ...]) -> list[dict[str, Any]]:
    """OpenAI's tool_calls; each gets an id `call_…` unless the model wrote its own (Mistral's, which its
    template wants back as it was)."""
    return [{"id": c.id or f"call_{secrets.token_hex(12)}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


async def whole(shape: Shape, base: dict[str, Any], first: dict[str, Any],
                events: AsyncIterator[dict[str, Any]], logprobs: bool = False, n: int = 1) -> web.Response:
    """A non-streamed reply: every event gathered into one chat.completion (or text_completion) of `n` choices."""
    text: dict[int, list[str]] = {i: [] for i in range(n)}
    entries: dict[int, list[dict[str, Any]]] = {i: [] for i in range(n)}
    fmts: dict[int, str] = {}
    notices: list[str] = []
    dones: dict[int, dict[str, Any]] = {}
    async for evt in chain(first, events):
        i = evt.get("index", 0)
        if "tool_format" in evt:
            fmts[i] = evt["tool_format"]
        if "error" in evt:
            return event_error(evt)
        if "delta" in evt:
            text[i].append(evt["delta"])
            entries[i] += evt.get("logprobs", [])
        if "notice" in evt:
            notices.append(evt["notice"])
        if "done" in evt:
            dones[i] = evt["done"]
    choices = []
    for i in range(n):
        finish, lp = dones.get(i, {}).get("finish_reason"), entries[i] if logprobs else None
        if i in fmts:  # a chat with tools: its calls read from the text
            reply = parse(fmts[i], "".join(text[i]))
            choices.append(shape.choice(reply.content, finish, lp, reply.calls, i))
        else:
            choices.append(shape.choice("".join(text[i]), finish, lp, index=i))
    return web.json_response({**base, "object": shape.whole(), "choices": choices, "usage": usage(dones),
                              "kafila": _stats(dones, notices)})


async def stream(request: web.Request, shape: Shape, base: dict[str, Any], first: dict[str, Any],
                 events: AsyncIterator[dict[str, Any]], include_usage: bool, logprobs: bool = False, n: int = 1
                 ) -> web.StreamResponse:
    """A streamed reply as Server-Sent Events: OpenAI's chunk objects of the endpoint's shape, each choice's
    carrying its `index`, then (asked for) one with the whole request's `usage`, then [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    base = {**base, "object": shape.chunk()}

    async def send(obj: dict[str, Any] | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await resp.write(f"data: {data}\n\n".encode())

    if shape.chat:  # a chat stream opens with the speaker's role, for each choice
        for i in range(n):
            await send({**base, "choices": [{"index": i, "delta": {"role": "assistant"}, "finish_reason": None}]})
    sent = dict.fromkeys(range(n), 0)  # characters of each choice's reply sent so far (a completion's text_offset)
    calls: dict[int, CallSplitter] = {}  # a chat with tools: text that may become a call is held back
    dones: dict[int, dict[str, Any]] = {}
    failed = False
    async for evt in chain(first, events):
        i = evt.get("index", 0)
        if "tool_format" in evt:  # once: a reply resumed on a new ring is told again
            calls.setdefault(i, CallSplitter(evt["tool_format"]))
        elif evt.get("delta") or (logprobs and evt.get("logprobs")):  # a held piece's tokens go with their numbers
            entries = evt.get("logprobs", []) if logprobs else None
            piece = calls[i].push(evt["delta"]) if i in calls else evt["delta"]
            if piece or entries:
                await send({**base, "choices": [shape.delta(piece, None, entries, sent[i], i)]})
            sent[i] += len(piece)
        elif "notice" in evt:  # no text: a line for the reader (clients that do not know it skip it)
            await send({**base, "choices": [], "kafila": {"notice": evt["notice"]}})
        elif "progress" in evt:  # a long prompt's prefill so far, likewise without choices
            await send({**base, "choices": [], "kafila": {"progress": evt["progress"]}})
        elif "error" in evt:
            await send({"error": _error_body(evt)})
            failed = True
            break
        elif "done" in evt:
            dones[i] = evt["done"]
            finish = dones[i].get("finish_reason")
            if i in calls:
                rest = calls[i].finish()
                if rest.content:
                    await send({**base, "choices": [shape.delta(rest.content, None, index=i)]})
                if rest.calls:
                    await send({**base, "choices": [tool_delta(rest.calls, i)]})
                    finish = "tool_calls"
            await send({**base, "choices": [shape.delta(None, finish, index=i)], "kafila": dones[i]})
    if include_usage and not failed:  # OpenAI's: one last chunk, no choices, the whole request's usage
        await send({**base, "choices": [], "usage": usage(dones)})
    await send("[DONE]")
    await resp.write_eof()
    return resp


def tool_delta(calls: tuple[Call, ...], index: int = 0) -> dict[str, Any]:
    """A streamed chunk's choice carrying whole calls (OpenAI's tool-call deltas, each at its index)."""
    return {"index": index, "delta": {"tool_calls": [{"index": i, **c} for i, c in enumerate(tool_calls(calls))]},
            "finish_reason": None}


async def chain(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for evt in rest:
        yield evt


def _stats(dones: dict[int, dict[str, Any]], notices: list[str]) -> dict[str, Any]:
    """The "kafila" block of a whole reply: the first choice's stats (and every choice's, when several)."""
    out = dict(dones.get(0, {}))
    if len(dones) > 1:
        out["choices"] = [dones[i] for i in sorted(dones)]
    return out | ({"notices": notices} if notices else {})


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

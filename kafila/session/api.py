"""The OpenAI-compatible endpoint on 127.0.0.1: `/v1/chat/completions` (streaming or not), `/v1/models`,
and `/kafila/state` (the session-state model as JSON, for dashboards on any member's machine).

Every process of a session serves it; the head answers chats itself, the others forward them
(members along the ring, the host over its control link to the head) through a `Forwarder`.
When a member is lost mid-reply, the reply is not lost: the request goes again, with the tokens
generated so far, to the ring the host plans over the others (`ApiServer.events`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from kafila.errors import NetworkError
from kafila.session import messages
from kafila.session.state import SessionState

log = logging.getLogger("kafila.api")
Chat = Callable[[dict[str, Any]], AsyncIterator[dict[str, Any]]]
EVENT_TIMEOUT_S = 30.0  # no event for this long from the head: the request ends with an error
RESUME_WAIT_S = 120.0  # how long a reply cut by a lost member waits for the re-planned ring


class Forwarder:
    """Sends chat requests toward the head and routes the answering chat_evt messages back."""

    def __init__(self, me: str, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.me, self.send = me, send
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._ids = itertools.count()

    async def chat(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        cid = f"{self.me}-{next(self._ids)}"
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._queues[cid] = queue
        try:
            await self.send(messages.encode(messages.Chat(cid, self.me, body)))
            while True:
                try:
                    evt = await asyncio.wait_for(queue.get(), EVENT_TIMEOUT_S)
                except TimeoutError:
                    yield {"error": f"the head sent nothing for {EVENT_TIMEOUT_S:.0f} s"}
                    return
                yield evt
                if "done" in evt or "error" in evt:
                    return
        except NetworkError as exc:
            yield {"error": f"cannot reach the head: {exc}"}
        finally:
            del self._queues[cid]

    def deliver(self, msg: messages.ChatEvt) -> bool:
        """Hand a chat_evt to its waiting request; False when it is not ours."""
        if msg.dest != self.me:
            return False
        queue = self._queues.get(msg.id)
        if queue is not None:
            queue.put_nowait(msg.evt)
        return True

    def fail_all(self, reason: str) -> None:
        """End the requests waiting on the head: a member was lost (the API server may resume them)."""
        for queue in self._queues.values():
            queue.put_nowait({"error": reason, "resumable": True})


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "kafila_error"}}, status=status)


class ApiServer:
    """The HTTP endpoint; `chat` is set once the session is admitted (503 before)."""

    def __init__(self, state: SessionState, host: str = "127.0.0.1", port: int = 8711) -> None:
        self.state, self.host, self.port = state, host, port
        self._chat: Chat | None = None
        self._epoch = 0  # counts the rings this server has been given to serve on
        self._ring_changed = asyncio.Event()  # set when a ring is given or the session's phase moves
        state.subscribe(lambda _state: self._ring_changed.set())
        self._runner: web.AppRunner | None = None
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/kafila/state", self._state)
        self.app = app

    @property
    def chat(self) -> Chat | None:
        """How this process sends a chat into the ring; None while the session is not serving."""
        return self._chat

    @chat.setter
    def chat(self, chat: Chat | None) -> None:
        self._chat = chat
        if chat is not None:
            self._epoch += 1
        self._ring_changed.set()

    async def events(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The chat's events; a reply cut by a lost member goes on, after a notice, on the re-planned ring."""
        tokens: list[int] = []
        max_tokens = int(body.get("max_tokens") or messages.DEFAULT_MAX_TOKENS)
        while True:
            chat, epoch = self._chat, self._epoch
            if chat is None:
                return
            if tokens and len(tokens) >= max_tokens:  # cut after its last token: nothing is left to do
                yield {"done": {"finish_reason": "length", "completion_tokens": len(tokens)}}
                return
            again = {**body, "resume": list(tokens), "max_tokens": max_tokens - len(tokens)} if tokens else body
            cut = None
            async for evt in chat(again):
                if "delta" in evt:
                    tokens += evt.get("tokens") or []
                elif "error" in evt and evt.get("resumable"):
                    cut = str(evt["error"])
                    continue  # the chat ends after an error; let it end (and clean up) by itself
                elif "done" in evt and tokens:
                    evt = {"done": {**evt["done"], "completion_tokens": len(tokens)}}
                yield evt
            if cut is None:
                return
            yield {"notice": f"{cut}; the reply continues once the host has planned a ring without it"}
            why = await self._next_ring(epoch)
            if why is not None:
                yield {"error": f"{cut}; {why}"}
                return

    async def _next_ring(self, epoch: int) -> str | None:
        """Wait for a ring newer than `epoch`; None when it serves, else why there will be none."""
        try:
            async with asyncio.timeout(RESUME_WAIT_S):
                while not (self._chat is not None and self._epoch > epoch):
                    if self.state.phase in ("rejected", "closed"):
                        return f"the session cannot go on ({self.state.rejection or self.state.phase})"
                    self._ring_changed.clear()
                    await self._ring_changed.wait()
        except TimeoutError:
            return f"no ring was planned within {RESUME_WAIT_S:.0f} s"
        return None

    async def start(self) -> str:
        """Start serving; returns the base URL (port 0 picks a free one)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            raise NetworkError(f"cannot serve the chat API on {self.host}:{self.port}: {exc.strerror}") from None
        port = self._runner.addresses[0][1]  # the real port when 0 asked for any
        self.url = f"http://{self.host}:{port}"
        self.state.api_url = self.url
        self.state.changed()
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.state.model or "kafila", "object": "model",
                                                             "owned_by": "kafila"}]})

    async def _state(self, _request: web.Request) -> web.Response:
        return web.json_response(self.state.to_json())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "the request needs a 'messages' list")
        if self.chat is None:
            why = self.state.rejection or self.state.lost or f"phase: {self.state.phase}"
            return _error(503, f"the session is not serving ({why})")
        cid = f"chatcmpl-{int(time.time() * 1000)}"
        model = self.state.model or "kafila"
        events = self.events(body)
        if not body.get("stream"):
            text, notices, done = [], [], None
            async for evt in events:
                if "error" in evt:
                    return _error(502, str(evt["error"]))
                if "delta" in evt:
                    text.append(evt["delta"])
                if "notice" in evt:
                    notices.append(evt["notice"])
                done = evt.get("done", done)
            done = {**(done or {}), **({"notices": notices} if notices else {})}
            return web.json_response({
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)},
                             "finish_reason": done.get("finish_reason")}],
                "usage": {"prompt_tokens": done.get("prompt_tokens"),
                          "completion_tokens": done.get("completion_tokens")},
                "kafila": done,
            })
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any] | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
        async for evt in events:
            if evt.get("delta"):
                delta = {"index": 0, "delta": {"content": evt["delta"]}, "finish_reason": None}
                await send({**base, "choices": [delta]})
            elif "notice" in evt:  # no text: a line for the reader (clients that do not know it skip it)
                await send({**base, "choices": [], "kafila": {"notice": evt["notice"]}})
            elif "error" in evt:
                await send({"error": {"message": str(evt["error"]), "type": "kafila_error"}})
                break
            elif "done" in evt:
                done = evt["done"]
                await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": done.get("finish_reason")}],
                            "kafila": done})
        await send("[DONE]")
        await resp.write_eof()
        return resp

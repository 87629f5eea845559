"""The OpenAI-compatible endpoint on 127.0.0.1: `/v1/chat/completions` and `/v1/completions` (raw text,
for every model, base models without a chat template too), each streaming or not; `/v1/models`; and
`/kafila/state` (the session-state model as JSON, for dashboards on any member's machine; never the
join code). Every request passes `api_guard.Guard` first; bodies are validated by `chat_request`.
Both kinds of request travel the ring the same way (the head tells them apart by `prompt`); only
the answer's shape differs (`Shape`).

Every process of a session serves it; the head answers chats itself, the others forward them
(members along the ring, the host over its control link to the head) through a `Forwarder`.
When a member is lost mid-reply, the reply is not lost: the request goes again, with the tokens
generated so far, to the ring the host plans over the others (`ApiServer.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from kafila.engine.stage import ContextConfig
from kafila.errors import NetworkError, SessionError
from kafila.model.gguf_file import GGUFFile
from kafila.session.api.choices import merged
from kafila.session.api.guard import Guard, error_response
from kafila.session.api.replies import CHAT, TEXT, Shape, event_error, stream, whole
from kafila.session.api.token import (
    NONCE_HEX,
    PROOF_PATH,
    endpoint,
    new_token,
    proof,
    remove_token,
    write_token,
)
from kafila.session.protocol import messages
from kafila.session.ring.chat_request import BadRequest, ChatRequest, parse_chat, parse_completion
from kafila.session.state import SessionState

log = logging.getLogger("kafila.api")
Chat = Callable[[dict[str, Any]], AsyncGenerator[dict[str, Any], None]]
RESUME_WAIT_S = 120.0  # how long a reply cut by a lost member waits for the re-planned ring
# How long a request that arrives while the ring is planned again waits for it: under the read timeout
# of kafila's own client (120 s, api/client.py), so that a re-plan too slow for it is a 503 that says why.
REPLAN_HOLD_S = 60.0
REPLANNING = ("lost", "waiting", "planning", "delivering", "connecting")  # the phases between two rings
PORT_TRIES = 20  # a port in use: the chat API takes the next free one of this many
MAX_BODY_BYTES = 2 * 1024 * 1024  # a chat body; chat_request bounds what the ring is sent within it


@dataclass(frozen=True)
class ModelContext:
    """What `/v1/models` tells of the served model's context: tokens a request may hold (the session's
    --context: prompt and reply), sequences served at once (--concurrency: `n` at most), and the context the model
    was trained with (its GGUF's, when known)."""

    n_ctx: int
    n_seq_max: int
    n_ctx_train: int | None = None

    @classmethod
    def of(cls, config: ContextConfig, meta: GGUFFile) -> ModelContext:
        """The session's context, and the trained one a stage file's metadata (`meta`) keeps."""
        arch = meta.get("general.architecture")
        trained = meta.get(f"{arch}.context_length") if isinstance(arch, str) else None
        return cls(config.n_ctx_per_seq, config.n_seq_max, trained if isinstance(trained, int) else None)

    def fields(self) -> dict[str, Any]:
        """The fields clients read a context length from: vLLM's `max_model_len`, `context_length` (OpenRouter's,
        LM Studio's), and llama.cpp's server's `meta` block (`n_ctx_train`; `n_ctx` as its /props says)."""
        meta = {"n_ctx": self.n_ctx, "n_ctx_train": self.n_ctx_train, "n_seq_max": self.n_seq_max}
        return {"max_model_len": self.n_ctx, "context_length": self.n_ctx, "meta": meta}


class Forwarder:
    """Sends chat requests toward the head and routes the answering chat_evt messages back."""

    def __init__(self, me: str, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.me, self.send = me, send
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._ids = itertools.count()

    async def chat(self, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        cid = f"{self.me}-{next(self._ids)}"
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._queues[cid] = queue
        try:
            await self.send(messages.encode(messages.Chat(cid, self.me, body)))
            # No silence timeout: a long prompt may legitimately take minutes (its request gets
            # progress events meanwhile), and a lost head or member is detected by its links,
            # which end these requests through fail_all.
            while True:
                evt = await queue.get()
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

    def fail_all(self, reason: str, lost: str | None = None, resumable: bool = True) -> None:
        """End the requests waiting on the head: member `lost` was lost (the API server may resume them)."""
        for queue in self._queues.values():
            queue.put_nowait({"error": reason, "resumable": resumable, "lost": lost})


class ApiServer:
    """The HTTP endpoint; `chat` is set once the session is admitted (503 before).

    Every request first passes the `Guard` (Host, Origin, bearer token, content type); with
    `require_token` (the default) the token is made at `start()` and written to a 0600 file.
    """

    def __init__(self, state: SessionState, host: str = "127.0.0.1", port: int = 8711, *,
                 require_token: bool = True) -> None:
        self.state, self.host, self.port = state, host, port
        self._chat: Chat | None = None
        self.context: ModelContext | None = None  # set with `chat` by the session code (what it planned for)
        self._epoch = 0  # counts the rings this server has been given to serve on
        self._ring_changed = asyncio.Event()  # set when a ring is given or the session's phase moves
        state.subscribe(lambda _state: self._ring_changed.set())
        self._runner: web.AppRunner | None = None
        self.guard = Guard()
        # Set before the port is bound, so no request is ever served without it (its file follows).
        self.token: str | None = new_token() if require_token else None
        self.guard.token = self.token
        self.token_path: Path | None = None
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self.guard.middleware])
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/completions", self._text_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/kafila/state", self._state)
        app.router.add_get(PROOF_PATH, self._proof)
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

    async def events(self, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The chat's events; a reply cut by a lost member goes on, after a notice, on the re-planned ring.

        A request goes on after the loss of the head serving it once (the head is a member like any
        other, and its machine may just have gone to sleep), never twice: a request that took two heads
        down may be why, and re-sending it would take down each next head.
        """
        tokens: list[int] = []
        cuts: list[int] = []  # the chunks the prompt first went round in: a resumed reply is rebuilt in them
        heads_lost = 0
        max_tokens = body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else messages.DEFAULT_MAX_TOKENS
        while True:
            chat, epoch = self._chat, self._epoch
            if chat is None:
                return
            if tokens and len(tokens) >= max_tokens:  # cut after its last token: nothing is left to do
                yield {"done": {"finish_reason": "length", "completion_tokens": len(tokens)}}
                return
            head = (self.state.plan or {}).get("head")
            resumed = len(tokens)
            again = ({**body, "resume": list(tokens), "resume_cuts": cuts, "max_tokens": max_tokens - len(tokens)}
                     if tokens else body)
            cut = None
            async with contextlib.aclosing(chat(again)) as replies:  # closed with these events (a client gone)
                async for evt in replies:
                    if "delta" in evt:
                        tokens += evt.get("tokens") or []
                        first = evt.pop("prompt_cuts", None)  # only for this server, not for the client
                        cuts = cuts or list(first or [])
                    elif "error" in evt and evt.get("resumable") and head is not None and evt.get("lost") == head \
                            and heads_lost:
                        evt = {"error": f"{evt['error']}; the request is not sent again: a second head was lost "
                                        "while serving it, and the request may be why"}
                    elif "error" in evt and evt.get("resumable"):
                        heads_lost += head is not None and evt.get("lost") == head
                        cut = str(evt["error"])
                        continue  # the chat ends after an error; let it end (and clean up) by itself
                    elif "done" in evt and tokens:
                        done = {**evt["done"], "completion_tokens": len(tokens)}
                        if resumed and isinstance(done.get("prompt_tokens"), int):
                            done["prompt_tokens"] -= resumed  # the new ring's prompt held the resumed tokens
                        evt = {"done": done}
                    yield evt
            if cut is None:
                return
            yield {"notice": f"{cut}; the reply continues once the ring is planned again"}
            why = await self._next_ring(epoch, RESUME_WAIT_S)
            if why is not None:
                yield {"error": f"{cut}; {why}"}
                return

    async def _next_ring(self, epoch: int, wait_s: float) -> str | None:
        """Wait up to `wait_s` for a ring newer than `epoch`; None when it serves, else why there will be none."""
        try:
            async with asyncio.timeout(wait_s):
                while not (self._chat is not None and self._epoch > epoch):
                    if self.state.phase in ("rejected", "closed"):
                        why = self.state.rejection or self.state.lost or self.state.phase
                        return f"the session cannot go on ({why})"
                    self._ring_changed.clear()
                    await self._ring_changed.wait()
        except TimeoutError:
            return f"no ring was planned within {wait_s:.0f} s"
        return None

    async def start(self) -> str:
        """Start serving; returns the base URL (port 0 picks a free one). The token file is written here.

        A port in use is no reason to end a session: the next free one of PORT_TRIES is taken, and the
        session's log says which. NetworkError only when none of them can be bound.
        """
        # handler_cancellation: a client that goes away cancels its handler, which closes its request's events
        # and so frees its slot at the head (else the ring decodes for nobody until max_tokens)
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        tries = [self.port] if self.port == 0 else list(range(self.port, min(self.port + PORT_TRIES, 65536)))
        failure = ""
        for port in tries:
            site = web.TCPSite(self._runner, self.host, port)
            try:
                await site.start()
                break
            except OSError as exc:
                await site.stop()  # no longer one of the runner's sites
                failure = f"cannot serve the chat API on {self.host}:{port}: {exc.strerror}"
                if exc.errno != errno.EADDRINUSE:
                    break
        else:
            failure = f"cannot serve the chat API: ports {tries[0]} to {tries[-1]} on {self.host} are all in use"
        if not self._runner.addresses:
            await self._runner.cleanup()
            raise NetworkError(failure)
        port = self._runner.addresses[0][1]  # the real port when 0 asked for any
        self.guard.port = port
        if self.token is not None:
            try:
                self.token_path = write_token(port, self.token)
            except SessionError:
                await self._runner.cleanup()
                raise
            self.guard.token_hint = (f": `kafila chat` and the TUI read it from {self.token_path}; another OpenAI "
                                     "client passes that file's text as its api_key")
        self.url = f"http://{self.host}:{port}"
        self.state.api_url = self.url
        if self.port not in (0, port):
            self.state.log(f"port {self.port} is in use: the chat API serves on {self.url} instead")
        else:
            self.state.log(f"the chat API serves on {self.url}")
        return self.url

    async def start_or_none(self) -> ApiServer | None:
        """start(); when no port can be bound, the session goes on without a chat API and its log says why."""
        try:
            await self.start()
        except NetworkError as exc:
            self.state.log(f"serving no chat API: {exc}")
            return None
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.token_path is not None and self.token is not None:
            remove_token(self.token_path, self.token)

    @property
    def model_id(self) -> str:
        """The id clients name the model by: the GGUF file's stem (the session sets it), else "kafila"."""
        return self.state.model or "kafila"

    async def _models(self, _request: web.Request) -> web.Response:
        model = {"id": self.model_id, "object": "model", "created": 0, "owned_by": "kafila"}
        if self.context is not None:
            model |= self.context.fields()
        return web.json_response({"object": "list", "data": [model]})

    async def _state(self, _request: web.Request) -> web.Response:
        return web.json_response(self.state.public_json())  # never the join code (DESIGN §5)

    async def _proof(self, request: web.Request) -> web.Response:
        nonce = request.query.get("nonce", "")
        if self.token is None or len(nonce) != NONCE_HEX or not all(c in "0123456789abcdef" for c in nonce):
            return error_response(400, f"'nonce' must be {NONCE_HEX} lowercase hex digits", "nonce")
        # the address this connection reached, as the kernel says (not the Host header a relay writes): a
        # client checks the proof against the address it dialled, so a relay on another port proves nothing
        address = endpoint(request.transport.get_extra_info("sockname") if request.transport else None)
        if address is None:
            return error_response(500, "the chat API cannot tell the address this connection reached")
        mine = secrets.token_bytes(NONCE_HEX // 2)
        return web.json_response({"proof": proof(self.token, bytes.fromhex(nonce), mine, address),
                                  "nonce": mine.hex(), "address": address})

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_chat, CHAT)

    async def _text_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_completion, TEXT)

    async def _serve(self, request: web.Request, parse: Callable[[Any], ChatRequest],
                     shape: Shape) -> web.StreamResponse:
        try:
            req = parse(_json_body(await request.read()))
        except BadRequest as exc:
            return error_response(400, str(exc), exc.param, exc.code)
        held = None
        if self.chat is None and self._epoch and self.state.phase in REPLANNING:
            # A ring served and the next is being planned (a member lost, a stage drifting): a re-plan takes
            # seconds, so the request waits for the new ring, as a reply cut by it does, instead of failing.
            held = await self._next_ring(self._epoch, REPLAN_HOLD_S)
        if self.chat is None:
            why = held or self.state.rejection or self.state.lost or f"phase: {self.state.phase}"
            return error_response(503, f"the session is not serving ({why})", code="not_serving")
        cid = f"{shape.prefix}-{int(time.time() * 1000)}"
        bodies = req.choices()  # one request toward the head per choice (choices.py)
        streams = [self.events(body) for body in bodies]
        async with contextlib.aclosing(streams[0] if len(streams) == 1 else merged(streams)) as events:
            # The first event decides the status: a request the head refuses (a prompt longer than the
            # context, say) is an HTTP error even when streamed, not a 200 whose stream holds the error.
            first = await anext(events, {"error": "the ring ended the request without an answer"})
            if "error" in first:
                return event_error(first)
            base = {"id": cid, "created": int(time.time()), "model": self.model_id}
            if not req.stream:
                return await whole(shape, base, first, events, req.logprobs is not None, req.n)
            return await stream(request, shape, base, first, events, req.include_usage, req.logprobs is not None,
                                req.n)


def _json_body(data: bytes) -> Any:
    """The body as JSON, strictly: UTF-8, no NaN or Infinity literals; BadRequest otherwise."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"the request body is not valid JSON ({_short_reason(exc)})", None, "invalid_json") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _short_reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]

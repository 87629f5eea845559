"""An async client for a Kafila session's chat API (OpenAI-compatible, streamed as Server-Sent Events).

The wire contract, as the session's head serves it (and every member forwards it):

* ``POST {api}/v1/chat/completions`` with ``{"model", "messages", "stream": true, "max_tokens",
  "temperature"}`` answers ``text/event-stream``: lines ``data: {chunk}`` whose
  ``choices[0].delta.content`` are text pieces; a final chunk carries
  ``"kafila": {"tokens_per_s", "stages": {name: {"predicted_s", "measured_s"}}, "network_share"}``;
  then ``data: [DONE]``. A chunk ``{"error": {"message"}}`` mid-stream ends the reply with an error;
  a chunk with no choices and ``"kafila": {"notice": …}`` is a line for the reader (a member was
  lost and the reply resumes on the re-planned ring); one with ``"kafila": {"progress":
  {"prefilled", "prompt_tokens"}}`` tells how much of a long prompt the ring has computed so far.
* ``POST {api}/v1/completions`` with ``{"model", "prompt", "stream": true, …}`` (raw text, no chat
  template: what a base model answers) streams the same way, its text in ``choices[0].text``. A chat
  sent to a model without a chat template is refused with code ``no_chat_template``; `stream_reply`
  then completes the text instead, and says so once.
* Errors before the stream: HTTP 4xx/5xx with ``{"error": {"message", "type", "param", "code"}}``.
* Every request carries ``Authorization: Bearer TOKEN``, the token the session wrote to a file only
  this user can read (kafila.session.api.token); without it the session answers 401.
* ``GET {api}/v1/models`` → ``{"data": [{"id": …}, …]}``; ``GET {api}/kafila/state`` →
  ``SessionState.public_json()`` (no join code).

Every failure is raised as one of the `ApiError` family below, each naming the URL, so the chat
command and the TUI can show it as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kafila.errors import NetworkError, SessionError

if TYPE_CHECKING:
    import aiohttp

    from kafila.session.state import SessionState

DEFAULT_API_URL = "http://127.0.0.1:8711"
HOW_TO_START = "start one with `kafila demo`, `kafila host` or `kafila join`"
RAW_TEXT_NOTICE = "model has no chat template; completing raw text"


class ApiUnreachable(NetworkError):
    """Nothing answers at the API URL (connection refused, unknown host)."""

    def __init__(self, url: str, detail: str = "") -> None:
        self.url = url
        extra = f" ({detail})" if detail else ""
        super().__init__(f"no Kafila session answers at {url}{extra}; {HOW_TO_START}")


class ApiTimeout(NetworkError):
    """The session accepted the connection but did not answer in time."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url = url
        super().__init__(f"the Kafila session at {url} did not answer within {seconds:g} s")


class ApiLost(NetworkError):
    """The connection broke, or the stream ended, before the reply was complete."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(f"the Kafila session at {url} stopped answering mid-reply: {detail}")


class ApiNotYours(SessionError):
    """Something answers at the API URL, but it is not this user's session: nothing was sent to it."""

    def __init__(self, url: str, why: str) -> None:
        self.url = url
        super().__init__(f"the server at {url} is not a Kafila session of yours ({why}); nothing was sent to it. "
                         f"Another program may hold that port: a session of yours moved to the next free one, "
                         f"which `kafila tui` and its log show")


class ApiError(SessionError):
    """The session answered with an error (an HTTP error status or an error chunk mid-stream)."""

    def __init__(self, url: str, message: str, status: int | None = None, code: str | None = None) -> None:
        self.url, self.status, self.detail, self.code = url, status, message, code
        where = f"HTTP {status}" if status is not None else "mid-reply"
        super().__init__(f"the Kafila session at {url} refused the request ({where}): {message}")


@dataclass(frozen=True)
class StageTiming:
    """One member's stage time for the last reply: what the planner predicted and what was measured."""

    predicted_s: float | None
    measured_s: float | None


@dataclass(frozen=True)
class Notice:
    """A line for the reader in the middle of a reply (e.g. a member was lost and the reply resumes)."""

    text: str
    source: str = "ring"  # who it is about: "ring" (members lost, resumed), "model" (no chat template)


@dataclass(frozen=True)
class Progress:
    """How much of the prompt the ring has computed before the reply's first token."""

    prefilled: int
    prompt_tokens: int

    def line(self) -> str:
        return f"reading the prompt: {self.prefilled}/{self.prompt_tokens} tokens"


@dataclass(frozen=True)
class ReplyStats:
    """The ``kafila`` block of a reply's final chunk."""

    tokens_per_s: float | None = None
    network_share: float | None = None
    stages: dict[str, StageTiming] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplyStats:
        """Parse leniently: a missing or malformed field becomes None rather than failing the reply."""
        stages: dict[str, StageTiming] = {}
        raw_stages = d.get("stages")
        if isinstance(raw_stages, dict):
            for name, s in raw_stages.items():
                if isinstance(s, dict):
                    stages[str(name)] = StageTiming(_num(s.get("predicted_s")), _num(s.get("measured_s")))
        return cls(_num(d.get("tokens_per_s")), _num(d.get("network_share")), stages, dict(d))

    def summary(self) -> str:
        """One plain line: tokens/s, the network's share, each stage's measured/predicted ms."""
        parts = []
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.network_share is not None:
            parts.append(f"network {self.network_share:.0%} of each token")
        if self.stages:
            cells = [f"{name} {_ms(s.measured_s)}/{_ms(s.predicted_s)}" for name, s in self.stages.items()]
            parts.append("stage ms measured/predicted: " + ", ".join(cells))
        return " · ".join(parts)


Item = str | Notice | Progress | ReplyStats  # what a streamed reply yields


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.1f}"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _error_code(body: Any) -> str | None:
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


def _error_message(body: Any) -> str | None:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return None


class ApiClient:
    """One connection pool to a session's API. Use as ``async with ApiClient(url) as api: …``."""

    def __init__(self, url: str = DEFAULT_API_URL, *, connect_timeout: float = 5.0, read_timeout: float = 120.0,
                 token: str | None = None):
        self.url = url.rstrip("/")
        self.token = token  # None: read the session's token file (api_token) before each request
        self.connect_timeout = connect_timeout
        # Longest wait for the next byte once connected: the first token includes prompt processing.
        self.read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None
        self._proven: str | None = None  # the token the server at url has shown it holds
        self.raw_text = False  # the session's model has no chat template: `stream_reply` completes text

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout, sock_read=self.read_timeout)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def _headers(self) -> dict[str, str]:
        """The bearer token (read afresh: a session restarted on the same port has a new one), once the server
        has proven it holds it: a program squatting on the port never gets the token, nor the conversation."""
        from kafila.session.api.token import NONCE_HEX, PROOF_PATH, proof, read_token, token_path

        token = self.token or read_token(self.url)
        if token is not None and token == self._proven:
            return {"Authorization": f"Bearer {token}"}
        nonce = secrets.token_bytes(NONCE_HEX // 2)
        with self._errors_named():  # no session there at all: ApiUnreachable, as before
            async with self._http().get(f"{self.url}{PROOF_PATH}?nonce={nonce.hex()}") as resp:
                body = await _read_body(resp)
        if token is None:
            port = urlsplit(self.url).port
            raise ApiNotYours(self.url, f"you hold no token for it: no {token_path(port or 0)}")
        body = body if isinstance(body, dict) else {}
        shown, theirs, address = body.get("proof"), body.get("nonce"), body.get("address")
        try:
            server_nonce = bytes.fromhex(theirs) if isinstance(theirs, str) and len(theirs) == NONCE_HEX else None
        except ValueError:
            server_nonce = None
        if not (isinstance(shown, str) and server_nonce is not None and isinstance(address, str) and len(address) < 64
                and hmac.compare_digest(shown, proof(token, nonce, server_nonce, address))):
            raise ApiNotYours(self.url, "it cannot prove it holds your session's token")
        # the proof is for the address the session was reached at: a program here relaying a session elsewhere
        # gets a proof for the session's own address, not this one
        if address not in await self._dialled():
            raise ApiNotYours(self.url, f"it relays your session, which serves at {address}: connect there")
        self._proven = token
        return {"Authorization": f"Bearer {token}"}

    async def _dialled(self) -> set[str]:
        """The addresses ("ip:port", token.endpoint) the URL names: what a connection to it reaches."""
        from kafila.session.api.token import endpoint

        parts = urlsplit(self.url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            found = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        except (OSError, ValueError):
            return set()
        return {a for *_, sockaddr in found if (a := endpoint(sockaddr)) is not None}

    async def _get_json(self, path: str) -> Any:
        url = self.url + path
        with self._errors_named():
            async with self._http().get(url, headers=await self._headers()) as resp:
                body = await _read_body(resp)
                if resp.status >= 400:
                    raise ApiError(self.url, _error_message(body) or f"{path} answered {resp.reason}", resp.status)
                return body

    async def models(self) -> list[str]:
        """The model ids the session serves (also a cheap "is anyone there?" check)."""
        body = await self._get_json("/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        return [str(m["id"]) for m in data or [] if isinstance(m, dict) and "id" in m]

    async def state(self) -> SessionState:
        """The session's current state, as its dashboard sees it."""
        from kafila.session.state import SessionState

        body = await self._get_json("/kafila/state")
        if not isinstance(body, dict):
            raise ApiError(self.url, "/kafila/state did not answer a JSON object")
        return SessionState.from_json(body)

    async def stream_chat(
        self,
        messages: list[dict[str, str]],
        *,
        model: str = "kafila",
        max_tokens: int = 512,
        temperature: float = 0.7,
        extra: dict[str, Any] | None = None,
    ) -> AsyncIterator[Item]:
        """Send a chat and yield the reply's text pieces (and `Notice`s) as they arrive, then its `ReplyStats`.

        `extra`: more body fields (Kafila's `speculate`, `cache_prompt`). Raises an `ApiError`-family exception
        (ApiUnreachable, ApiTimeout, ApiLost, ApiError).
        """
        async for item in self._stream("/v1/chat/completions", {"messages": messages, **(extra or {})}, model,
                                       max_tokens, temperature):
            yield item

    async def stream_completion(
        self,
        prompt: str,
        *,
        model: str = "kafila",
        max_tokens: int = 512,
        temperature: float = 0.7,
    ) -> AsyncIterator[Item]:
        """Complete raw text (no chat template), yielding as `stream_chat` does."""
        async for item in self._stream("/v1/completions", {"prompt": prompt}, model, max_tokens, temperature):
            yield item

    async def stream_reply(
        self,
        messages: list[dict[str, str]],
        *,
        model: str = "kafila",
        max_tokens: int = 512,
        temperature: float = 0.7,
    ) -> AsyncIterator[Item]:
        """A chat; when the model has no chat template (a base model), the last user message's text is
        completed instead, after one `Notice` saying so (the first time this client finds out)."""
        from kafila.session.ring.chat_request import NO_CHAT_TEMPLATE

        options: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
        if not self.raw_text:
            try:
                async for item in self.stream_chat(messages, **options):
                    yield item
                return
            except ApiError as exc:
                if exc.code != NO_CHAT_TEMPLATE:
                    raise
            self.raw_text = True
            yield Notice(RAW_TEXT_NOTICE, "model")
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        async for item in self.stream_completion(prompt, **options):
            yield item

    async def _stream(self, path: str, request: dict[str, Any], model: str, max_tokens: int,
                      temperature: float) -> AsyncIterator[Item]:
        """POST `request` (the messages or the prompt) with the model and sampling options, streamed; its items."""
        payload = {"model": model, **request, "stream": True, "max_tokens": max_tokens, "temperature": temperature}
        with self._errors_named():
            async with self._http().post(self.url + path, json=payload, headers=await self._headers()) as resp:
                if resp.status >= 400:
                    body = await _read_body(resp)
                    raise ApiError(self.url, _error_message(body) or str(resp.reason), resp.status,
                                   _error_code(body))
                if "text/event-stream" not in resp.headers.get("Content-Type", ""):
                    # A server that ignored "stream": answer the whole reply at once.
                    async for item in _whole_reply(self.url, await _read_body(resp)):
                        yield item
                    return
                async for item in _events(self.url, resp):
                    yield item

    @contextlib.contextmanager
    def _errors_named(self) -> Iterator[None]:
        """aiohttp's failures as this module's errors, each naming the URL."""
        import aiohttp

        try:
            yield
        except TimeoutError:
            raise ApiTimeout(self.url, self.read_timeout) from None
        except aiohttp.ClientConnectorError as exc:
            raise ApiUnreachable(self.url, _why(exc)) from None
        except aiohttp.ClientError as exc:
            raise ApiLost(self.url, _why(exc)) from None


def _why(exc: BaseException) -> str:
    # aiohttp's messages repeat the URL; the OS reason (e.g. "Connection refused") is what helps.
    os_error = getattr(exc, "os_error", None)
    if os_error is not None and getattr(os_error, "strerror", None):
        return str(os_error.strerror).lower()
    return str(exc) or type(exc).__name__


async def _read_body(resp: aiohttp.ClientResponse) -> Any:
    text = await resp.text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


async def _whole_reply(url: str, body: Any) -> AsyncIterator[Item]:
    message = _error_message(body)
    if message is not None:
        raise ApiError(url, message)
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"] if "message" in choice else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise ApiLost(url, "the answer is neither a stream nor a completion") from None
    if content:
        yield str(content)
    if isinstance(body.get("kafila"), dict):
        yield ReplyStats.from_json(body["kafila"])


async def _events(url: str, resp: aiohttp.ClientResponse) -> AsyncIterator[Item]:
    """Parse the SSE stream: `data:` lines only (comments, `event:` and blank lines are skipped)."""
    async for raw in resp.content:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise ApiLost(url, f"a stream line is not JSON: {data[:80]!r}") from None
        message = _error_message(chunk)
        if message is not None:
            raise ApiError(url, message, code=_error_code(chunk))
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            # a chat chunk's text is in its delta; a text completion's in `text`
            piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            if piece:
                yield str(piece)
        extra = chunk.get("kafila")
        if isinstance(extra, dict) and isinstance(extra.get("notice"), str):
            yield Notice(extra["notice"])
        elif isinstance(extra, dict) and isinstance(extra.get("progress"), dict):
            p = extra["progress"]
            done, total = _num(p.get("prefilled")), _num(p.get("prompt_tokens"))
            if done is not None and total is not None:
                yield Progress(int(done), int(total))
        elif isinstance(extra, dict):
            yield ReplyStats.from_json(extra)
    raise ApiLost(url, "the stream ended before [DONE]")

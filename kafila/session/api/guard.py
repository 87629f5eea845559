"""Who may use the chat API: checks every request passes before any handler sees it (DESIGN §5).

A web page the user opens can reach 127.0.0.1 by DNS rebinding (its own name resolving to
127.0.0.1: the request then carries a foreign ``Host``) or by a "simple" cross-site POST (a foreign
``Origin``, ``Content-Type: text/plain``, no preflight). Every local user can reach it too. So, in
this order: ``Host`` must name this server on loopback (else 403), an ``Origin``, if any, must be
this server (else 403), the bearer token must match when one is set (else 401), and a POST must
say ``application/json`` (else 415). Every error, the handlers' own included, is answered in
OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from kafila.session.api.token import PROOF_PATH

log = logging.getLogger("kafila.api")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error"}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    """An error as OpenAI answers one."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}},
                             status=status, headers=headers)


class Guard:
    """The checks, as an aiohttp middleware; `port` and `token` are set once the server is bound."""

    def __init__(self, token_hint: str = "") -> None:
        self.port: int | None = None
        self.token: str | None = None
        self.token_hint = token_hint  # where the user's own clients read the token, for the 401's message

    def allowed_hosts(self) -> set[str]:
        return {f"{name}:{self.port}" for name in LOOPBACK_NAMES}

    def refusal(self, request: web.Request) -> web.Response | None:
        """The error this request gets before it reaches a handler, or None when it may go on."""
        host = request.headers.get("Host", "")
        if host.lower() not in self.allowed_hosts():
            return error_response(403, f"the chat API answers only requests for 127.0.0.1:{self.port}, "
                                       f"localhost:{self.port} or [::1]:{self.port}, not Host {_short(host)!r} "
                                       "(a web page under another name is refused)", code="foreign_host")
        origin = request.headers.get("Origin")
        if origin is not None and origin.lower() not in {f"http://{h}" for h in self.allowed_hosts()}:
            return error_response(403, f"requests from web pages are refused (Origin {_short(origin)!r})",
                                  code="foreign_origin")
        if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
            return error_response(403, "requests from web pages are refused (cross-site fetch)",
                                  code="foreign_origin")
        # the proof is how a client tells its own session from a program squatting on the port: asked
        # before the client sends its token, so it needs none (it gives away a MAC over the client's nonce, a
        # nonce of the server's and the address the connection reached: useless to a relay on another port)
        if self.token is not None and not self._authorized(request) and \
                not (request.method == "GET" and request.path == PROOF_PATH):
            return error_response(401, f"this chat API needs its bearer token{self.token_hint}",
                                  code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if request.method == "POST" and request.content_type != "application/json":
            return error_response(415, f"a request body must be JSON sent as application/json, not "
                                       f"{_short(request.content_type)!r}", code="unsupported_media_type")
        return None

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        assert self.token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except web.HTTPException as exc:  # aiohttp's own 404, 405, 413 ... in the same shape
            if exc.status < 400:
                raise
            return error_response(exc.status, exc.reason)
        except ConnectionError:  # the client went away mid-stream: nothing to answer
            raise
        except Exception:  # a bug answers this request with a 500; the server keeps serving the others
            log.exception("the chat API failed on %s %s", request.method, request.path)
            return error_response(500, "the chat API failed on this request (its log says why)")


def _short(text: Any) -> str:
    text = str(text)
    return text if len(text) <= 60 else text[:57] + "..."

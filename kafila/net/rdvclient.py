"""The rendezvous client: STUN probes and control requests (kafila.net.wire REQUEST/RESPONSE) with retries.

It owns no socket: it sends through the endpoint's one socket (`send`) and is handed the
answers the endpoint core demultiplexed (`on_stun`, `on_control`). Requests wait on futures,
bounded by per-try timeouts; replies are matched by STUN transaction id or request id.
The session registration lives here too: `create`, `join`, the periodic `rejoin`, `leave`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import Any

from kafila.errors import KafilaError, NetworkError, NotMember, SessionError, UnknownSession
from kafila.net import registration, stun, wire
from kafila.net.trust import JoinCode

log = logging.getLogger("kafila.net")
Addr = tuple[str, int]
REANNOUNCE_S = 60.0  # a re-join publishes our announcement again once it is this old
Body = dict[str, Any] | Callable[[bytes], dict[str, Any]]  # a request, or one made for the cookie it goes with


class RendezvousClient:
    """Requests from one member to its rendezvous."""

    def __init__(self, member_id: bytes, send: Callable[[bytes, Addr], None]) -> None:
        self.member_id = member_id
        self._send = send
        self.rendezvous: Addr | None = None
        self.code: JoinCode | None = None
        self.reg_key: bytes | None = None  # from our first join; re-joins prove it instead of the token
        self.sealed: str | None = None  # our announcement, published again when the rendezvous forgot it
        # (when, cookie): the rendezvous's proof that our address reads its replies
        self._cookie: tuple[float, bytes] | None = None
        self._ops = 0  # the last counter of our signed ops under reg_key
        self._announced_at = 0.0  # loop time of our latest announce
        self._stun_waiters: dict[bytes, asyncio.Future[stun.StunMessage]] = {}
        self._control_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}

    # ---- answers, from the endpoint core ------------------------------------------------

    def on_stun(self, msg: stun.StunMessage) -> None:
        """A Binding answer: resolves the request with its transaction id, if any waits."""
        fut = self._stun_waiters.get(msg.txid)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def on_control(self, request_id: int, body: dict[str, Any]) -> None:
        """A RESPONSE from the rendezvous (the core checked its source)."""
        fut = self._control_waiters.get(request_id)
        if fut is not None and not fut.done():
            fut.set_result(body)

    # ---- requests ------------------------------------------------------------------------

    async def stun_request(self, dst: Addr, change: int, timeout_s: float, tries: int) -> stun.StunMessage | None:
        """One Binding request to dst, resent up to `tries` times; None when nothing answered."""
        txid = secrets.token_bytes(12)
        fut: asyncio.Future[stun.StunMessage] = asyncio.get_running_loop().create_future()
        self._stun_waiters[txid] = fut
        try:
            for _ in range(tries):
                self._send(stun.encode(stun.StunMessage(stun.BINDING_REQUEST, txid, change=change)), dst)
                try:
                    async with asyncio.timeout(timeout_s):
                        return await asyncio.shield(fut)
                except TimeoutError:
                    continue
            return None
        finally:
            del self._stun_waiters[txid]

    def send_control(self, body: dict[str, Any]) -> None:
        """A request whose answer nobody waits for."""
        if self.rendezvous is not None:
            self._send(wire.encode_control(wire.REQUEST, secrets.randbits(32), body), self.rendezvous)

    async def request(self, body: Body, timeout_s: float = 0.5, tries: int = 6) -> dict[str, Any]:
        """One op, resent until answered; NetworkError when it never is, SessionError when it is refused.

        An op that needs the rendezvous's cookie for our address (COOKIE_OPS, or a body made for the
        cookie: a first join signs it) goes with the latest one we were given, asked for first when we
        have none fresh; when the answer is a new one (our address changed), the op goes again with it."""
        if not callable(body) and body.get("op") not in registration.COOKIE_OPS:
            return self._checked(body, await self._exchange(body, timeout_s, tries))
        make = body if callable(body) else (lambda _cookie: body)
        now = asyncio.get_running_loop().time()
        if self._cookie is None or now - self._cookie[0] > registration.COOKIE_FRESH_S:
            self._take_cookie(self._checked({"op": "cookie"}, await self._exchange(
                registration.cookie_body(), timeout_s, tries)))
        for again in (False, True):
            assert self._cookie is not None
            sent = {**make(self._cookie[1]), "cookie": self._cookie[1].hex()}
            reply = await self._exchange(sent, timeout_s, tries)
            if again or reply.get("ok") is True or reply.get("code") != "cookie":
                break
            self._take_cookie(reply)
        return self._checked(sent, reply)

    def _take_cookie(self, reply: dict[str, Any]) -> None:
        self._cookie = (asyncio.get_running_loop().time(), wire.get_hex(reply, "cookie", registration.COOKIE_LEN))

    async def _exchange(self, body: dict[str, Any], timeout_s: float, tries: int) -> dict[str, Any]:
        """The rendezvous's answer to one request, whatever it says."""
        if self.rendezvous is None:
            raise SessionError("no rendezvous set: create or join a session first")
        rid = secrets.randbits(32)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._control_waiters[rid] = fut
        data = wire.encode_control(wire.REQUEST, rid, body)
        try:
            for _ in range(tries):
                self._send(data, self.rendezvous)
                try:
                    async with asyncio.timeout(timeout_s):
                        reply = await asyncio.shield(fut)
                    break
                except TimeoutError:
                    continue
            else:
                raise NetworkError(
                    f"rendezvous {self.rendezvous[0]}:{self.rendezvous[1]} did not answer {body.get('op')!r} "
                    f"({tries} tries in {tries * timeout_s:.1f} s)"
                )
        finally:
            del self._control_waiters[rid]
        return reply

    @staticmethod
    def _checked(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """The reply when it says ok; else the refusal as an error (one place maps replies to exceptions)."""
        if reply.get("ok") is not True:
            raise registration.refusal(body.get("op"), reply)  # a SessionError subclass chosen by its code
        return reply

    # ---- the session registration ---------------------------------------------------------

    async def create(self, rendezvous: Addr, secret: str | None = None) -> JoinCode:
        """Ask for a new session (we make the secret; the rendezvous never sees it) and join it."""
        self.rendezvous = rendezvous
        secret = secret or JoinCode.new_secret()
        provisional = JoinCode.parse("00000000" + secret)  # checks the secret's form
        reply = await self.request({"op": "create", "join_pub": provisional.join_public.hex()})
        code = JoinCode(wire.get_str(reply, "session", 8), secret)
        await self.join(rendezvous, code)
        return code

    async def join(self, rendezvous: Addr, code: JoinCode | str) -> JoinCode:
        """Register in a session; WrongJoinCode / UnknownSession (SessionErrors) when the rendezvous refuses it."""
        self.rendezvous = rendezvous
        code = JoinCode.parse(code) if isinstance(code, str) else code
        reply = await self.request(self._signed_join(code))
        self.reg_key, self._ops = registration.reg_key_of(reply), 0
        self.code = code
        return code

    async def rejoin(self) -> None:
        """The periodic re-join, not a bare ping: if our NAT rebinds, the rendezvous learns the new address.

        It proves the registration key over a server nonce (kafila.net.registration). A member the
        rendezvous forgot (silent past its timeout) registers afresh; a session it forgot (it
        restarted) is created again under its id, then joined and announced afresh, so that the
        relay and the member list work again. Failures are logged: the next re-join tries again.
        """
        code, reg_key = self.code, self.reg_key
        if code is None or reg_key is None:
            return
        try:
            try:
                await registration.rejoin(self.request, code.session_id, self.member_id, reg_key)
                if self.sealed is not None and \
                        asyncio.get_running_loop().time() - self._announced_at > REANNOUNCE_S:
                    await self.announce(self.sealed)  # what the rendezvous keeps of us is ours, whatever befell it
            except NotMember:
                await self._register_again(code)
            except UnknownSession:
                await self.request({"op": "create", "join_pub": code.join_public.hex(), "session": code.session_id})
                await self._register_again(code)
                log.warning("the rendezvous had forgotten session %s: created it again and re-registered",
                            code.session_id)
        except KafilaError as exc:
            log.info("re-join with the rendezvous failed: %s", exc)

    async def _register_again(self, code: JoinCode) -> None:
        """A first join again (a new registration key), and our announcement published again."""
        reply = await self.request(self._signed_join(code))
        self.reg_key, self._ops = registration.reg_key_of(reply), 0
        if self.sealed is not None:
            await self.announce(self.sealed)

    def _signed(self, body: dict[str, Any]) -> dict[str, Any]:
        """One of our ops as a registered member: ours, counted and MAC'd with our registration key."""
        assert self.code is not None and self.reg_key is not None
        self._ops += 1
        mine = {**body, "session": self.code.session_id, "member": self.member_id.hex()}
        return registration.signed(mine, self.reg_key, self._ops)

    def _signed_join(self, code: JoinCode) -> Callable[[bytes], dict[str, Any]]:
        """A first join, made for the cookie it signs."""
        return lambda cookie: registration.join_body(code.session_id, self.member_id,
                                                     code.join_proof(self.member_id, cookie))

    async def announce(self, sealed: str) -> None:
        """Publish a sealed announcement (see kafila.net.trust)."""
        if self.code is None:
            raise SessionError("join a session before announcing")
        await self.request(self._signed({"op": "announce", "ann": sealed}))
        self.sealed, self._announced_at = sealed, asyncio.get_running_loop().time()

    async def list_page(self, start: int) -> dict[str, Any]:
        """One page of the session's member list, from entry `start`."""
        if self.code is None:
            raise SessionError("join a session first")
        return await self.request(self._signed({"op": "list", "start": start}))

    def leave(self) -> None:
        """Tell the rendezvous we are gone (best effort)."""
        if self.code is not None:
            self.send_control(self._signed({"op": "leave"}))

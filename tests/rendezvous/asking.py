"""Asking an in-process RendezvousCore as a member's client does: an op that needs the cookie for its
source address is sent first without one, and the cookie answer (checked no larger than the request) echoed;
a first join is made for that cookie (it signs it). The join code's keys come from SECRET."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafila.net import registration, wire
from kafila.net.trust import JoinCode
from rendezvous.core import Addr, RendezvousCore

SECRET = "4f8tzr2w9mhcqp3a"
OTHER_SECRET = "zzzzzzzzzzzzzzzz"  # another code's
Body = dict[str, Any] | Callable[[bytes], dict[str, Any]]


def create_body(secret: str = SECRET, session: str | None = None) -> dict[str, Any]:
    """A host's create for the code of `secret` (again under `session`, as after a rendezvous restart)."""
    return {"op": "create", "join_pub": JoinCode("00000000", secret).join_public.hex(),
            **({"session": session} if session else {})}


def join_for(sid: str, mid: bytes, secret: str = SECRET) -> Callable[[bytes], dict[str, Any]]:
    """A first join of member `mid` to session `sid`, signed for the cookie it is sent with."""
    return lambda cookie: registration.join_body(sid, mid, JoinCode(sid, secret).join_proof(mid, cookie))


def answer(c: RendezvousCore, body: dict[str, Any], src: Addr, local: Addr, now: float,
           rid: int) -> tuple[int, dict[str, Any] | None]:
    """(the request's size, the reply's body, or None when the rendezvous stayed silent)."""
    data = wire.encode_control(wire.REQUEST, rid, body)
    out = c.handle(data, src, local, now)
    assert len(out) <= 1
    if not out:
        return len(data), None
    reply, via, dst = out[0]
    assert via == local and dst == src
    frame = wire.decode(reply)
    assert isinstance(frame, wire.Control) and frame.request_id == rid
    return len(data), frame.body


def echoing_cookie(c: RendezvousCore, body: Body, src: Addr, local: Addr, now: float,
                   rid: int) -> tuple[int, dict[str, Any] | None]:
    """`answer`, after a first try without the cookie where the op needs one (a body made for the cookie:
    first with a made-up one)."""
    make = body if callable(body) else (lambda _cookie: body)
    first = make(b"\0" * registration.COOKIE_LEN)
    if first.get("op") not in registration.COOKIE_OPS or "cookie" in first:
        return answer(c, first, src, local, now, rid)
    size, reply = answer(c, first, src, local, now, rid)
    if reply is None or reply.get("code") != "cookie":
        return size, reply
    assert len(wire.encode_control(wire.RESPONSE, rid, reply)) <= size, reply
    cookie = bytes.fromhex(reply["cookie"])
    return answer(c, {**make(cookie), "cookie": cookie.hex()}, src, local, now, rid)

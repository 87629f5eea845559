"""Asking an in-process RendezvousCore as a member's client does: an op that needs the cookie for its
source address is sent first without one, and the cookie answer (checked no larger than the request) echoed."""

from __future__ import annotations

from typing import Any

from kafila.net import registration, wire
from rendezvous.core import Addr, RendezvousCore


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


def echoing_cookie(c: RendezvousCore, body: dict[str, Any], src: Addr, local: Addr, now: float,
                   rid: int) -> tuple[int, dict[str, Any] | None]:
    """`answer`, after a first try without the cookie where the op needs one."""
    size, reply = answer(c, body, src, local, now, rid)
    if body.get("op") in registration.COOKIE_OPS and "cookie" not in body and reply is not None \
            and reply.get("code") == "cookie":
        assert len(wire.encode_control(wire.RESPONSE, rid, reply)) <= size, reply
        return answer(c, {**body, "cookie": reply["cookie"]}, src, local, now, rid)
    return size, reply

"""A member's registration with the rendezvous: one signed first join, MAC'd re-joins after it.

A first join proves the member knows the join code without sending anything derived from it that
could be used again: an Ed25519 signature (the join key, derived from the code's secret, see
kafila.net.trust) over the session id, the member id and the rendezvous's cookie for the member's
address (rendezvous.cookies), checked against the public key the host gave at `create`. The reply
carries a fresh registration key the rendezvous keeps for that member id. Every later re-join —
which moves the member's relay address to wherever its NAT now maps it — proves that key over a
single-use server nonce:

    join      {"op":"join", "session", "member": hex8, "proof": hex64, "cookie"}  -> {"members": n, "reg": hex32}
              proof = Ed25519(join key, b"kafila-join\x00" | session id | member id (8) | cookie (16)),
              only for a member id the session does not have yet (else code "member_exists")
    challenge {"op":"challenge", "session", "member"}                     -> {"nonce": hex16}
              from any source address; the nonce is good for a re-join from that address for 30 s, once
              (it is a MAC the rendezvous keeps nothing for: rendezvous.nonces)
    rejoin    {"op":"rejoin", "session", "member", "nonce": hex16, "mac": hex32}  -> {"members": n}
              mac = HMAC-SHA256(reg, b"kafila-rejoin\\x00" | session id (ASCII, 8) | member id (8) | nonce (16))

So whoever sees a re-join, or replays one, can neither register a member id nor move its relay
address. A registered member's other ops (announce, list, ping, leave: SIGNED_OPS) carry a counter
"n" and "mac" = HMAC-SHA256(reg, b"kafila-op\x00" | the body's canonical JSON without "mac"), each
counter taken once, so a spoofed or replayed op from the member's address changes nothing.
Refusals carry a machine-readable code, mapped here to the types in kafila.errors.
Both sides use this module: the rendezvous to issue keys and check MACs, the member to make them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kafila.errors import RENDEZVOUS_CODES, RendezvousError
from kafila.net import wire

PUBLIC_LEN = 32  # the join key's public half (raw Ed25519)
PROOF_LEN = 64  # a first join's signature
REG_KEY_LEN = 32
NONCE_LEN = 16
MAC_LEN = 32
NONCE_TTL_S = 30.0
COOKIE_LEN = 16  # the rendezvous's return-routability cookie (rendezvous.cookies)
COOKIE_OPS = frozenset({"create", "join", "rejoin"})  # ops that place state for an address: they need one
COOKIE_PAD = 48  # a cookie request's padding: its answer must not be larger than it
COOKIE_FRESH_S = 25.0  # a cookie is good for 30-60 s (rendezvous.cookies); asked again after this
_LABEL = b"kafila-rejoin\x00"

# What each refusal code means to a person, used by the rendezvous and when a reply had to
# leave its text out (a refusal is never larger than the request it answers).
MESSAGES: dict[str, str] = {
    "wrong_code": "wrong join code for this session",
    "unknown_session": "no such session (expired, or the join code is mistyped)",
    "not_member": "not a member of this session; join again",
    "member_exists": "member id already registered in this session",
    "rate_limited": "too many requests; wait a moment and retry",
    "full": "no room here; try later",
    "stale_nonce": "stale or reused nonce; challenge again",
    "bad_mac": "re-join MAC does not verify",
    "bad_request": "malformed request",
    "cookie": "send the request again with this cookie",
}

Request = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def new_reg_key() -> bytes:
    """A fresh registration key (the rendezvous makes one per first join)."""
    return secrets.token_bytes(REG_KEY_LEN)


def rejoin_mac(reg_key: bytes, session_id: str, member_id: bytes, nonce: bytes) -> bytes:
    """The MAC a re-join carries; every input has a fixed length, so plain concatenation is unambiguous."""
    return hmac.new(reg_key, _LABEL + session_id.encode() + member_id + nonce, hashlib.sha256).digest()


def mac_ok(reg_key: bytes, session_id: str, member_id: bytes, nonce: bytes, mac: bytes) -> bool:
    """True when mac is the re-join MAC for these inputs (constant-time compare)."""
    return hmac.compare_digest(rejoin_mac(reg_key, session_id, member_id, nonce), mac)


def join_message(session_id: str, member_id: bytes, cookie: bytes) -> bytes:
    """What a first join signs; every input has a fixed length, so plain concatenation is unambiguous."""
    return b"kafila-join\x00" + session_id.encode() + member_id + cookie


def join_body(session_id: str, member_id: bytes, proof: bytes) -> dict[str, Any]:
    """The first join's request body (the cookie its proof signs goes beside it)."""
    return {"op": "join", "session": session_id, "member": member_id.hex(), "proof": proof.hex()}


def proof_ok(public: bytes, session_id: str, member_id: bytes, cookie: bytes, proof: bytes) -> bool:
    """True when `proof` is the join key's signature for these inputs (the key whose public half is `public`)."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(proof, join_message(session_id, member_id, cookie))
    except (InvalidSignature, ValueError):
        return False
    return True


def cookie_body() -> dict[str, Any]:
    """A request for the rendezvous's cookie for our address, padded to be no smaller than its answer."""
    return {"op": "cookie", "pad": "." * COOKIE_PAD}


SIGNED_OPS = frozenset({"announce", "list", "ping", "leave"})  # a registered member's ops: MAC'd, counted
OP_WINDOW = 64  # counters this far below the highest seen are still taken once (requests may cross)


def op_mac(reg_key: bytes, body: dict[str, Any]) -> bytes:
    """The MAC a registered member's op carries: over the body's canonical JSON (every field but "mac")."""
    canonical = json.dumps({k: v for k, v in body.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(reg_key, b"kafila-op\x00" + canonical.encode(), hashlib.sha256).digest()


def signed(body: dict[str, Any], reg_key: bytes, n: int) -> dict[str, Any]:
    """`body` with its counter `n` (each used once) and its MAC under the registration key."""
    counted = {**body, "n": n}
    return {**counted, "mac": op_mac(reg_key, counted).hex()}


def challenge_body(session_id: str, member_id: bytes) -> dict[str, Any]:
    """A request for a fresh nonce to re-join with."""
    return {"op": "challenge", "session": session_id, "member": member_id.hex()}


def rejoin_body(session_id: str, member_id: bytes, reg_key: bytes, nonce: bytes) -> dict[str, Any]:
    """A re-join proving the registration key over the nonce."""
    mac = rejoin_mac(reg_key, session_id, member_id, nonce)
    return {"op": "rejoin", "session": session_id, "member": member_id.hex(), "nonce": nonce.hex(), "mac": mac.hex()}


def reg_key_of(reply: dict[str, Any]) -> bytes:
    """The registration key from a join's reply; ProtocolError when it has none."""
    return wire.get_hex(reply, "reg", REG_KEY_LEN)


async def rejoin(request: Request, session_id: str, member_id: bytes, reg_key: bytes) -> int:
    """Challenge, then re-join from wherever we are now; the member count, or the refusal raised."""
    nonce = wire.get_hex(await request(challenge_body(session_id, member_id)), "nonce", NONCE_LEN)
    reply = await request(rejoin_body(session_id, member_id, reg_key, nonce))
    return wire.get_int(reply, "members", 0, 1 << 16)


def refusal(op: Any, reply: dict[str, Any]) -> RendezvousError:
    """The exception for a refused request: its type from the reply's code, its text for a person."""
    code = reply.get("code")
    cls = RENDEZVOUS_CODES.get(code) if isinstance(code, str) else None
    if cls is None or not isinstance(code, str):
        code, cls = "refused", RendezvousError
    text = reply.get("error")
    if not isinstance(text, str) or not text or len(text) > 200 or not text.isprintable():
        text = MESSAGES.get(code, "no reason given")  # a reply cut to its code, or a text not fit to print
    return cls(f"rendezvous refused {op!r}: {text}", code)

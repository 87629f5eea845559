"""Stateless re-join nonces: a keyed MAC over the member, the address that asked and when, kept nowhere.

A `challenge` used to replace the member's one outstanding nonce, so one spoofed challenge between a
member's own challenge and its re-join made that re-join fail ("stale_nonce") until the member expired.
Now nothing is stored when a nonce is issued: it carries the time it was issued (milliseconds), a little
salt, and a MAC under a secret of the process over those, the session, the member id and the source
address it was sent to. A re-join is checked against its own source address, so a nonce a stranger asks
for from its address is good only there, and changes nothing for the member. Single use is kept by the
member's record of nonces already used (rendezvous.state.Member.spent), only while they are fresh.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from kafila.net.registration import NONCE_LEN, NONCE_TTL_S

Addr = tuple[str, int]
_TIME, _SALT = 6, 2  # bytes: issued at (ms, mod 2**48: wraps after 8,900 years), salt; the rest is the MAC
_LABEL = b"kafila-rejoin-nonce\x00"


class Nonces:
    """Issues and checks re-join nonces under a secret that lives as long as the process."""

    def __init__(self, secret: bytes | None = None) -> None:
        # a secret of its own, even from a given one: a nonce is never a valid cookie, nor the other way
        self._secret = hmac.new(secret, _LABEL, hashlib.sha256).digest() if secret else secrets.token_bytes(32)

    def _mac(self, head: bytes, session_id: str, member_id: bytes, src: Addr) -> bytes:
        msg = b"|".join((head, session_id.encode(), member_id, src[0].encode(), str(src[1]).encode()))
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:NONCE_LEN - len(head)]

    def issue(self, session_id: str, member_id: bytes, src: Addr, now: float) -> bytes:
        """A fresh nonce for this member's re-join from `src`."""
        head = _ms(now).to_bytes(_TIME, "big") + secrets.token_bytes(_SALT)
        return head + self._mac(head, session_id, member_id, src)

    def fresh(self, nonce: bytes, session_id: str, member_id: bytes, src: Addr, now: float) -> bool:
        """True when `nonce` was issued for this member's re-join from `src` at most NONCE_TTL_S ago."""
        if len(nonce) != NONCE_LEN:
            return False
        head = nonce[:_TIME + _SALT]
        if not hmac.compare_digest(self._mac(head, session_id, member_id, src), nonce[len(head):]):
            return False
        age_ms = (_ms(now) - int.from_bytes(head[:_TIME], "big")) % (1 << 8 * _TIME)
        return age_ms <= NONCE_TTL_S * 1000

    @staticmethod
    def expires(nonce: bytes, now: float) -> float:
        """When a fresh nonce stops being fresh (on the clock `now` is on): what `spent` needs to keep it."""
        age_ms = (_ms(now) - int.from_bytes(nonce[:_TIME], "big")) % (1 << 8 * _TIME)
        return now + NONCE_TTL_S - age_ms / 1000


def _ms(now: float) -> int:
    return int(now * 1000) % (1 << 8 * _TIME)

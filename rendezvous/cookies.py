"""Stateless return-routability cookies, as QUIC's Retry tokens: proof that a source address reads replies.

A cookie is a keyed MAC over the source address and a time epoch; the rendezvous keeps nothing per
cookie. An op that makes state for an address (create, join, rejoin) is answered only with a
cookie, in a reply no larger than the request, until the address sends it back, so a spoofed source
can neither fill the session table nor register a victim's address to aim replies and relayed
traffic at.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from kafila.net.registration import COOKIE_LEN

Addr = tuple[str, int]
EPOCH_S = 30.0  # a cookie is good in its epoch and the next: between 30 and 60 s


class Cookies:
    """Issues and checks cookies under a secret that lives as long as the process."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, src: Addr, epoch: int) -> bytes:
        msg = f"{epoch}|{src[0]}|{src[1]}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:COOKIE_LEN]

    def issue(self, src: Addr, now: float) -> bytes:
        """The cookie for `src` now."""
        return self._mac(src, int(now // EPOCH_S))

    def valid(self, cookie: bytes, src: Addr, now: float) -> bool:
        """True when `cookie` was issued to `src` in this epoch or the one before."""
        epoch = int(now // EPOCH_S)
        return any(hmac.compare_digest(self._mac(src, e), cookie) for e in (epoch, epoch - 1))

"""QUIC Retry tokens for the endpoint core's edges (RFC 9000 §8.1.2), sans-I/O.

An Initial from a peer creates a connection only once that peer has shown it receives what is sent
to it along its path: the first Initial is answered with a Retry whose token binds the peer's member
id, the connection ids and the time under a key of this endpoint; the peer's QUIC sends its Initial
again with the token. A Retry travels the way every datagram to that member does (its punched
direct address, else the rendezvous relay to its registered address), so a throwaway client that
forged Initials "from" a member, through the relay or from one of its candidate addresses, never
sees the token and takes no handshake slot from the real member.

    token = issued at (ms, 8 bytes) | original destination id length (1) | original destination id
            | retry source id (8) | HMAC-SHA256(key, member id | all of the above)[:16]
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

TOKEN_TTL_S = 10.0  # a Retry answered later than this (a lost one is sent again by the peer's QUIC) is stale
MAC_LEN = 16
RETRY_CID_LEN = 8


class RetryTokens:
    """Makes and checks this endpoint's Retry tokens (its key lives as long as the endpoint)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _mac(self, member_id: bytes, body: bytes) -> bytes:
        return hmac.new(self._key, member_id + body, hashlib.sha256).digest()[:MAC_LEN]

    def make(self, member_id: bytes, original_dcid: bytes, now: float) -> tuple[bytes, bytes]:
        """(token, retry source connection id) for a Retry to `member_id`'s Initial."""
        retry_cid = secrets.token_bytes(RETRY_CID_LEN)
        body = struct.pack("!QB", int(now * 1000), len(original_dcid)) + original_dcid + retry_cid
        return body + self._mac(member_id, body), retry_cid

    def check(self, member_id: bytes, token: bytes, dcid: bytes, now: float) -> bytes | None:
        """The original destination id the token carries, when it is ours, for this member and the Initial's
        destination id, and fresh; else None."""
        if len(token) < 9 + RETRY_CID_LEN + MAC_LEN:
            return None
        body, mac = token[:-MAC_LEN], token[-MAC_LEN:]
        issued_ms, n = struct.unpack_from("!QB", body)
        if len(body) != 9 + n + RETRY_CID_LEN or not hmac.compare_digest(self._mac(member_id, body), mac):
            return None
        original, retry_cid = body[9:9 + n], body[9 + n:]
        if retry_cid != dcid or not 0 <= now - issued_ms / 1000 <= TOKEN_TTL_S:
            return None
        return original

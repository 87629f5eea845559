"""Join codes and the trust layer: the rendezvous routes by session id but never sees the secret.

A join code looks like ``k7q2m9xd-4f8t-zr2w-9mhc-qp3a``: 8 base32 characters of session id
(assigned by the rendezvous, it is the lookup key) and 16 of secret (80 bits, made by the host).
From the secret, HKDF-SHA256 (salt "kafila-v1", info = purpose + session id) derives:

* ``join_token`` (16 bytes, info without the session id): shown to the rendezvous at join time;
  the rendezvous stores only its SHA-256, so a wrong code fails early with a clear error.
  It reveals nothing about the other keys.
* ``announce_key``: HMAC-SHA256 over each member's announcement (certificate fingerprint,
  addresses, NAT class, measurements). A member that does not know the secret cannot make one;
  the rendezvous cannot change one (e.g. swap a fingerprint) without the MAC failing.
* ``punch_key``: MACs on punch frames, so only members can steer a peer's direct path.

Every QUIC edge then pins the peer's certificate fingerprint taken from a verified announcement.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kafila.errors import ProtocolError, SessionError
from kafila.net import wire
from kafila.planner.reachability import NatClass

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32: no i, l, o, u
_CONFUSABLE = str.maketrans({"i": "1", "l": "1", "o": "0"})
SESSION_ID_LEN = 8
SECRET_LEN = 16  # 16 x 5 bits = 80 bits the rendezvous never sees
MAX_ANNOUNCEMENT = 900  # bytes of JSON body; with the MAC and base64 it fits one control datagram
_CODE_RE = re.compile(rf"^[{_ALPHABET}]{{{SESSION_ID_LEN}}}[{_ALPHABET}]{{{SECRET_LEN}}}$")


def random_b32(n: int) -> str:
    """n random Crockford base32 characters."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def valid_session_id(s: str) -> bool:
    """True for a well-formed session id."""
    return len(s) == SESSION_ID_LEN and all(c in _ALPHABET for c in s)


def _hkdf(secret: str, purpose: str, session_id: str, n: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=n, salt=b"kafila-v1", info=f"{purpose}|{session_id}".encode()).derive(
        secret.encode()
    )


@dataclass(frozen=True)
class JoinCode:
    """A session id (the rendezvous sees it) plus a secret (it never does)."""

    session_id: str
    secret: str = field(repr=False)

    @staticmethod
    def new_secret() -> str:
        """A fresh 80-bit secret, made by the host before it asks for a session."""
        return random_b32(SECRET_LEN)

    @staticmethod
    def parse(text: str) -> JoinCode:
        """Read a code as typed by a person: case, dashes, spaces and confusable letters are forgiven."""
        s = re.sub(r"[\s\-_]", "", text.strip().lower()).translate(_CONFUSABLE)
        if not _CODE_RE.match(s):
            raise SessionError(
                f"join code {text.strip()!r} is malformed: expected {SESSION_ID_LEN + SECRET_LEN} letters/digits "
                "like k7q2m9xd-4f8t-zr2w-9mhc-qp3a"
            )
        return JoinCode(s[:SESSION_ID_LEN], s[SESSION_ID_LEN:])

    def __str__(self) -> str:
        q = self.secret
        return "-".join([self.session_id, q[0:4], q[4:8], q[8:12], q[12:16]])

    @property
    def join_token(self) -> bytes:
        """What the rendezvous checks at join time (it stores only the hash)."""
        # Not bound to the session id: the host needs the hash before the rendezvous assigns the id.
        return _hkdf(self.secret, "join-token", "", 16)

    @property
    def join_token_hash(self) -> bytes:
        """What the host gives the rendezvous when it creates the session."""
        return hashlib.sha256(self.join_token).digest()

    @property
    def announce_key(self) -> bytes:
        """HMAC key for announcements."""
        return _hkdf(self.secret, "announce", self.session_id, 32)

    @property
    def punch_key(self) -> bytes:
        """HMAC key for punch frames."""
        return _hkdf(self.secret, "punch", self.session_id, 32)


def punch_mac(key: bytes, kind: int, sender: bytes, receiver: bytes, stamp: int, nonce: bytes) -> bytes:
    """The 16-byte MAC on a punch frame."""
    msg = wire.punch_mac_input(kind, sender, receiver, stamp, nonce)
    return hmac.new(key, msg, hashlib.sha256).digest()[: wire.MAC_LEN]


@dataclass(frozen=True)
class Announcement:
    """What a member says about itself; the MAC over it proves it knows the join code."""

    session_id: str
    member_id: bytes
    name: str
    fingerprint: bytes  # SHA-256 of the member's certificate SPKI: the pin for every edge to it
    nat_class: str
    mapped: tuple[str, int] | None  # address the rendezvous saw in the member's probe
    local: tuple[str, int] | None
    rtt_ms: float | None
    measurements: dict[str, Any]
    issued_at: float

    def body(self) -> bytes:
        """Canonical JSON bytes (what the MAC covers)."""
        d = {
            "v": 1,
            "session": self.session_id,
            "member": self.member_id.hex(),
            "name": self.name,
            "fp": self.fingerprint.hex(),
            "nat": self.nat_class,
            "mapped": list(self.mapped) if self.mapped else None,
            "local": list(self.local) if self.local else None,
            "rtt_ms": self.rtt_ms,
            "m": self.measurements,
            "t": round(self.issued_at, 3),
        }
        raw = json.dumps(d, separators=(",", ":"), sort_keys=True).encode()
        if len(raw) > MAX_ANNOUNCEMENT:
            raise SessionError(f"announcement is {len(raw)} bytes; keep measurements under {MAX_ANNOUNCEMENT}")
        return raw

    def seal(self, code: JoinCode) -> str:
        """Body + MAC, base64 (what travels through the rendezvous, opaque to it)."""
        raw = self.body()
        tag = hmac.new(code.announce_key, b"kafila-announce-v1" + raw, hashlib.sha256).digest()
        return base64.b64encode(raw + tag).decode()


@dataclass(frozen=True)
class VerifiedMember:
    """A member whose announcement carried a valid MAC under this session's join code."""

    member_id: bytes
    name: str
    fingerprint: bytes
    nat_class: NatClass
    mapped: tuple[str, int] | None
    local: tuple[str, int] | None
    observed: tuple[str, int] | None  # what the rendezvous says it sees: a hint, not covered by the MAC
    rtt_ms: float | None
    measurements: dict[str, Any]

    @property
    def short_id(self) -> str:
        """A short printable id for logs."""
        return self.member_id.hex()[:8]


def open_announcement(
    sealed: str, code: JoinCode, claimed_member: bytes, observed: tuple[str, int] | None = None
) -> VerifiedMember:
    """Check an announcement's MAC and that it belongs to this session and member; SessionError if not."""
    try:
        blob = base64.b64decode(sealed.encode(), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ProtocolError("announcement is not base64") from None
    if len(blob) < 33 or len(blob) > MAX_ANNOUNCEMENT + 32:
        raise ProtocolError("announcement has a bad length")
    raw, tag = blob[:-32], blob[-32:]
    good = hmac.new(code.announce_key, b"kafila-announce-v1" + raw, hashlib.sha256).digest()
    if not hmac.compare_digest(tag, good):
        raise SessionError(
            f"member {claimed_member.hex()[:8]} was refused: its announcement does not carry this join code's MAC "
            "(an outsider, or a rendezvous that altered it)"
        )
    try:
        d = json.loads(raw)
        if d.get("v") != 1 or not isinstance(d, dict):
            raise ValueError("version")
        vm = VerifiedMember(
            member_id=bytes.fromhex(d["member"]),
            name=str(d["name"])[:64],
            fingerprint=bytes.fromhex(d["fp"]),
            nat_class=NatClass(d["nat"]),
            mapped=wire.get_addr(d["mapped"], "mapped") if d["mapped"] is not None else None,
            local=wire.get_addr(d["local"], "local") if d["local"] is not None else None,
            observed=observed,
            rtt_ms=float(d["rtt_ms"]) if d["rtt_ms"] is not None else None,
            measurements=dict(d["m"]),
        )
        session = d["session"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"announcement body is malformed: {exc}") from None
    if session != code.session_id:
        raise SessionError(f"member {claimed_member.hex()[:8]} announced itself for another session")
    if vm.member_id != claimed_member:
        raise SessionError(
            f"the rendezvous listed member {claimed_member.hex()[:8]} with the announcement of "
            f"{vm.member_id.hex()[:8]}: refused"
        )
    if len(vm.fingerprint) != 32:
        raise ProtocolError("announcement fingerprint must be 32 bytes")
    return vm


def now_wall() -> float:
    """Wall-clock time for announcements (informational only; nothing depends on synchronised clocks)."""
    return time.time()

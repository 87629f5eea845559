"""Join codes and the trust layer: the rendezvous routes by session id but never sees the secret.

A join code looks like ``k7q2m9xd-4f8t-zr2w-9mhc-qp3a``: 8 base32 characters of session id
(assigned by the rendezvous, it is the lookup key) and 16 of secret (80 bits, made by the host).
From the secret, HKDF-SHA256 (salt "kafila-v1", info = purpose + session id) derives:

* ``join_key`` (an Ed25519 key pair, info without the session id): the host gives the rendezvous
  its public half when it creates the session; a member joins by signing the session id, its member
  id and the rendezvous's cookie for its address with the private half, so a wrong code fails early
  with a clear error, and nothing a join sends lets anyone who sees it join (the secret, and a
  token derived from it, never cross the network). It reveals nothing about the other keys.
* ``announce_key``: ChaCha20-Poly1305 over each member's announcement (name, certificate
  fingerprint, addresses, NAT class, measurements, the time it was made). A member that does not
  know the secret cannot make one; the rendezvous can neither read one nor change one (e.g. swap a
  fingerprint) without the tag failing.
* ``punch_key``: not a MAC key by itself (every member holds it): the salt of each pair's punch key.
  Each member announces an X25519 public key (kafila.net.quic.Identity makes the pair); two members
  A and B MAC their punch frames with HKDF(X25519(a, B), salt punch_key, info both ids and keys),
  which A and B can derive and a third member cannot (``pair_punch_key``): so nobody, member or
  not, can steer the direct path between two others (issue #56 item 1).

Every QUIC edge then pins the peer's certificate fingerprint taken from a verified announcement;
a member's punch key is pinned with it (kafila.net.members).

A sealed announcement, as the rendezvous stores and lists it (base64, opaque to it)::

    0x03 | nonce (12 random bytes) | ChaCha20-Poly1305(announce_key, nonce, body deflated and padded
    with zeros to a multiple of 128 bytes, associated data "kafila-announce-v2|" + session id)

The body is canonical JSON; ``t`` (when it was made, wall clock) lets a reader refuse one older
than a session can live (MAX_ANNOUNCEMENT_AGE_S) or older than one already seen from the member.
So the rendezvous learns a member's id, the address it talks from and when, and its
announcement's size to within 128 bytes, and nothing else of it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import secrets
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kafila.errors import ProtocolError, SessionError
from kafila.net import registration, wire
from kafila.planner.reachability import NatClass

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32: no i, l, o, u
_CONFUSABLE = str.maketrans({"i": "1", "l": "1", "o": "0"})
SESSION_ID_LEN = 8
SECRET_LEN = 16  # 16 x 5 bits = 80 bits the rendezvous never sees
# Bytes of the body as sealed (its JSON deflated: hex keys and fingerprints take half their characters, so the
# largest announcement, ~950 bytes of JSON, seals in ~600); sealed and in base64 (1240 characters) it fits one
# control datagram
MAX_ANNOUNCEMENT = 900
MAX_ANNOUNCEMENT_JSON = 4096  # a body inflating past this is refused, not inflated further
ANNOUNCE_VERSION = 3  # 3: the body deflated (zlib)
ANNOUNCE_PAD = 128  # bodies are padded to a multiple of this: the rendezvous learns sizes only this coarsely
_NONCE_LEN, _TAG_LEN = 12, 16
# A session lives at most 24 h at the rendezvous; the extra hour forgives clocks that differ.
MAX_ANNOUNCEMENT_AGE_S = 25 * 3600.0
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

    def _join_key(self) -> Ed25519PrivateKey:
        # Not bound to the session id: the host gives the public key before the rendezvous assigns the id.
        return Ed25519PrivateKey.from_private_bytes(_hkdf(self.secret, "join-key", "", 32))

    @property
    def join_public(self) -> bytes:
        """What the host gives the rendezvous when it creates the session (32 bytes, raw Ed25519)."""
        return self._join_key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def join_proof(self, member_id: bytes, cookie: bytes) -> bytes:
        """What a join carries instead of any secret: a signature over the session, member id and cookie."""
        return self._join_key().sign(registration.join_message(self.session_id, member_id, cookie))

    @property
    def announce_key(self) -> bytes:
        """ChaCha20-Poly1305 key for announcements."""
        return _hkdf(self.secret, "announce-v2", self.session_id, 32)

    @property
    def punch_key(self) -> bytes:
        """The session's salt for every pair's punch key (pair_punch_key); never a MAC key itself."""
        return _hkdf(self.secret, "punch", self.session_id, 32)


PUNCH_PUBLIC_LEN = 32  # a raw X25519 public key


def pair_punch_key(session_key: bytes, me: bytes, mine: X25519PrivateKey, peer: bytes, theirs: bytes) -> bytes:
    """The punch MAC key of the pair (me, peer): the same from either end, underivable by a third member.

    ValueError for a public key that is malformed or of low order (an all-zero shared secret).
    """
    if len(theirs) != PUNCH_PUBLIC_LEN:
        raise ValueError(f"a punch public key is {PUNCH_PUBLIC_LEN} bytes, not {len(theirs)}")
    shared = mine.exchange(X25519PublicKey.from_public_bytes(theirs))  # raises ValueError on an all-zero result
    ours = mine.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    lo, hi = sorted([(me, ours), (peer, theirs)])
    info = b"kafila-punch-pair|" + lo[0] + lo[1] + hi[0] + hi[1]
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=session_key, info=info).derive(shared)


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
    punch_public: bytes = b""  # the member's X25519 public key: its punch frames' pair keys come from it

    def body(self) -> bytes:
        """Canonical JSON bytes (what is sealed)."""
        d = {
            "v": ANNOUNCE_VERSION,
            "session": self.session_id,
            "member": self.member_id.hex(),
            "name": self.name,
            "fp": self.fingerprint.hex(),
            "pk": self.punch_public.hex(),
            "nat": self.nat_class,
            "mapped": list(self.mapped) if self.mapped else None,
            "local": list(self.local) if self.local else None,
            "rtt_ms": self.rtt_ms,
            "m": self.measurements,
            "t": round(self.issued_at, 3),
        }
        raw = json.dumps(d, separators=(",", ":"), sort_keys=True).encode()
        if len(raw) > MAX_ANNOUNCEMENT_JSON:
            raise SessionError(f"announcement is {len(raw)} bytes; keep measurements under {MAX_ANNOUNCEMENT_JSON}")
        return raw

    def packed(self) -> bytes:
        """The body deflated: what is padded and sealed."""
        packed = zlib.compress(self.body(), 9)
        if len(packed) > MAX_ANNOUNCEMENT:
            raise SessionError(f"announcement is {len(packed)} bytes deflated; keep measurements under "
                               f"{MAX_ANNOUNCEMENT}")
        return packed

    def seal(self, code: JoinCode) -> str:
        """The body, padded and encrypted under the join code, in base64: what travels through the rendezvous."""
        raw = self.packed()
        # zeros after the deflated stream's end are ignored by the reader
        padded = raw.ljust(min(-(-len(raw) // ANNOUNCE_PAD) * ANNOUNCE_PAD, MAX_ANNOUNCEMENT), b"\0")
        nonce = secrets.token_bytes(_NONCE_LEN)
        sealed = ChaCha20Poly1305(code.announce_key).encrypt(nonce, padded, _aad(code))
        return base64.b64encode(bytes([ANNOUNCE_VERSION]) + nonce + sealed).decode()


def _aad(code: JoinCode) -> bytes:
    return b"kafila-announce-v2|" + code.session_id.encode()


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
    issued_at: float = 0.0  # when the member made its announcement (its wall clock)
    punch_public: bytes = b""  # its X25519 public key (pair_punch_key); pinned with the fingerprint

    @property
    def short_id(self) -> str:
        """A short printable id for logs."""
        return self.member_id.hex()[:8]


def open_announcement(
    sealed: str, code: JoinCode, claimed_member: bytes, observed: tuple[str, int] | None = None, *,
    previous: VerifiedMember | None = None, now: float | None = None,
) -> VerifiedMember:
    """Decrypt and check an announcement: this session's, this member's, fresh, and not older than `previous`
    (the last one accepted from the member); SessionError if it is refused, ProtocolError if malformed."""
    who = f"member {claimed_member.hex()[:8]}"
    try:
        blob = base64.b64decode(sealed.encode(), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ProtocolError("announcement is not base64") from None
    if not 1 + _NONCE_LEN + _TAG_LEN < len(blob) <= 1 + _NONCE_LEN + MAX_ANNOUNCEMENT + _TAG_LEN:
        raise ProtocolError("announcement has a bad length")
    if blob[0] != ANNOUNCE_VERSION:
        raise ProtocolError(f"announcement is of version {blob[0]}, not {ANNOUNCE_VERSION} (a different Kafila)")
    try:
        raw = ChaCha20Poly1305(code.announce_key).decrypt(blob[1:1 + _NONCE_LEN], blob[1 + _NONCE_LEN:], _aad(code))
    except InvalidTag:
        raise SessionError(
            f"{who} was refused: its announcement does not carry this join code's MAC "
            "(an outsider, or a rendezvous that altered it)"
        ) from None
    vm, session = _parse_body(_inflate(raw), observed)
    if session != code.session_id:
        raise SessionError(f"{who} announced itself for another session")
    if vm.member_id != claimed_member:
        raise SessionError(f"the rendezvous listed {who} with the announcement of {vm.member_id.hex()[:8]}: refused")
    age = (now_wall() if now is None else now) - vm.issued_at
    if age > MAX_ANNOUNCEMENT_AGE_S:
        raise SessionError(f"{who} was refused: its announcement is {age / 3600:.0f} h old, older than any live "
                           "session (a replay, or a clock that is far off)")
    if previous is not None and previous.member_id == vm.member_id and vm.issued_at < previous.issued_at:
        raise SessionError(f"{who} was refused: its announcement is older than one already seen from it (a replay)")
    return vm


def _inflate(padded: bytes) -> bytes:
    """The JSON body of an opened announcement; ProtocolError if it is not one deflated stream of at most
    MAX_ANNOUNCEMENT_JSON bytes followed by zeros."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(padded, MAX_ANNOUNCEMENT_JSON)
    except zlib.error as exc:
        raise ProtocolError(f"announcement body is not deflated: {exc}") from None
    if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data.strip(b"\0"):
        raise ProtocolError("announcement body is too large or not one deflated stream")
    return raw


def _parse_body(raw: bytes, observed: tuple[str, int] | None) -> tuple[VerifiedMember, object]:
    try:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("v") != ANNOUNCE_VERSION:
            raise ValueError(f"not a version {ANNOUNCE_VERSION} announcement object")
        issued_at = float(d["t"])
        if not math.isfinite(issued_at):
            raise ValueError("its time is not a number")
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
            issued_at=issued_at,
            punch_public=bytes.fromhex(d["pk"]),
        )
        session = d["session"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"announcement body is malformed: {exc}") from None
    if len(vm.fingerprint) != 32:
        raise ProtocolError("announcement fingerprint must be 32 bytes")
    if len(vm.punch_public) != PUNCH_PUBLIC_LEN:
        raise ProtocolError(f"announcement punch key must be {PUNCH_PUBLIC_LEN} bytes")
    return vm, session


def now_wall() -> float:
    """Wall-clock time for announcements (informational only; nothing depends on synchronised clocks)."""
    return time.time()

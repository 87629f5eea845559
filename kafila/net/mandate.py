"""How a member finds its session's coordinator: by certificate, bound to the join code, never by majority.

The host makes the join code's secret from its own certificate: with a random 16-byte salt,

    secret = base32(SHA-256("kafila-host-v1|" + fingerprint + salt)[:10])     (80 bits, 16 characters)

and announces the salt (sealed, as every announcement is). A member checks that a coordinator's fingerprint
and salt give its code's secret: to pass as the host, another code holder would need a certificate whose
fingerprint hashes to those 80 bits (a second preimage: 2^80 tries). Announcing members, however many, count
for nothing.

A member that takes coordination over (kafila.session.member.takeover) is not bound to the code; the
coordinator hands each member that may succeed it a mandate, its ECDSA signature (with its certificate's
key) over "kafila-mandate-v1|" + session id + the successor's fingerprint, in the roster. The successor
announces its chain: the salt, then per link the signer's public key (a compressed P-256 point, from which
its fingerprint follows) and its signature. A member accepts a coordinator whose chain starts at the
code-bound host and whose every link is signed by the one before; it tries the shortest chain first (the
host while it lives; a holder mandated in advance only once it does not answer).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kafila.errors import ProtocolError
from kafila.net.trust import SECRET_LEN, JoinCode

CREDENTIAL_KEY = "cred"  # the announcement's measurement carrying a coordinator's credential
SALT_LEN = 16
MAX_LINKS = 2  # a chain this long still fits an announcement (kafila.net.trust.MAX_ANNOUNCEMENT)
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # the join code's (kafila.net.trust)


def bound_secret(fingerprint: bytes, salt: bytes) -> str:
    """The join code secret a host with this certificate fingerprint and salt makes."""
    digest = hashlib.sha256(b"kafila-host-v1|" + fingerprint + salt).digest()
    n = int.from_bytes(digest[:SECRET_LEN * 5 // 8])
    return "".join(_ALPHABET[(n >> (5 * i)) & 31] for i in reversed(range(SECRET_LEN)))


@dataclass(frozen=True)
class Credential:
    """A coordinator's proof that it coordinates: the host's salt, and the mandates from the host to it."""

    salt: bytes
    links: tuple[tuple[bytes, bytes], ...] = ()  # (signer's compressed public key, its signature over the next)

    @staticmethod
    def new_host() -> Credential:
        """A host's: a fresh salt, no mandate (its secret is bound_secret(its fingerprint, salt))."""
        return Credential(secrets.token_bytes(SALT_LEN))

    def as_json(self) -> dict[str, Any]:
        return {"salt": self.salt.hex(), "links": [[k.hex(), s.hex()] for k, s in self.links]}

    @staticmethod
    def from_json(obj: Any) -> Credential:
        """Its announced form; ProtocolError when malformed."""
        try:
            salt = bytes.fromhex(obj["salt"])
            links = tuple((bytes.fromhex(k), bytes.fromhex(s)) for k, s in obj["links"])
        except (TypeError, KeyError, ValueError, AttributeError):
            raise ProtocolError("a coordinator's credential is malformed") from None
        if len(salt) != SALT_LEN or len(links) > MAX_LINKS:
            raise ProtocolError("a coordinator's credential has a bad salt or too many links")
        return Credential(salt, links)

    def delegate(self, key: ec.EllipticCurvePrivateKey, session_id: str, successor: bytes) -> Credential | None:
        """The credential the member with certificate fingerprint `successor` announces should it coordinate next,
        signed by this credential's holder with its certificate's `key`; None past MAX_LINKS."""
        if len(self.links) >= MAX_LINKS:
            return None
        return Credential(self.salt, (*self.links, (public_point(key), mandate(key, session_id, successor))))


def public_point(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A certificate key's public half as a compressed P-256 point (33 bytes)."""
    return key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)


def point_fingerprint(point: bytes) -> bytes:
    """The certificate fingerprint (SHA-256 of the SubjectPublicKeyInfo, kafila.net.quic) of a public point."""
    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()


def _mandate_text(session_id: str, successor: bytes) -> bytes:
    return b"kafila-mandate-v1|" + session_id.encode() + b"|" + successor


def mandate(key: ec.EllipticCurvePrivateKey, session_id: str, successor: bytes) -> bytes:
    """The coordinator's signature letting the member with certificate fingerprint `successor` coordinate next."""
    return key.sign(_mandate_text(session_id, successor), ec.ECDSA(hashes.SHA256()))


def verify(credential: Credential, code: JoinCode, fingerprint: bytes) -> bool:
    """Whether the coordinator with certificate `fingerprint` announcing `credential` coordinates `code`'s session."""
    try:
        signers = [point_fingerprint(k) for k, _ in credential.links]
        chain = [*signers, fingerprint]
        if not hmac.compare_digest(bound_secret(chain[0], credential.salt), code.secret):
            return False
        for (point, signature), successor in zip(credential.links, chain[1:], strict=True):
            key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
            key.verify(signature, _mandate_text(code.session_id, successor), ec.ECDSA(hashes.SHA256()))
    except (ValueError, InvalidSignature):
        return False
    return True

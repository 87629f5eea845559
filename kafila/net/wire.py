"""Kafila's own UDP frames: control requests to the rendezvous, relay envelopes, punch packets.

Every member has ONE UDP socket; its first byte says what a datagram is (RFC 7983 style):

    0x00-0x03  STUN (probes, see kafila.net.stun)
    0x04-0x3F  Kafila frames, below
    0x40-0xFF  QUIC (aioquic always sets the fixed bit 0x40)

Kafila frames (all integers big-endian, member ids are 8 raw bytes):

    0x10 REQUEST   member -> rendezvous   u32 request_id | UTF-8 JSON object  (one op, see rendezvous.core)
    0x11 RESPONSE  rendezvous -> member   u32 request_id | UTF-8 JSON object  ({"ok": true, ...} or
                                                                               {"ok": false, "error": str})
    0x20 RELAY     member -> rendezvous   to_id[8] | payload      (sender known by its registered address)
    0x21 RELAYED   rendezvous -> member   from_id[8] | payload
    0x30 PUNCH     member -> member       from_id[8] | to_id[8] | u64 stamp | nonce[8] | mac[16]
    0x31 PUNCH_ACK member -> member       same layout; answers a PUNCH, sent to the address it came from;
                                          its nonce is the PUNCH's (the one it answers), echoed
    0x32 PUNCH_GO  member -> member (relayed) same layout; "start punching toward me now"

A relay payload is either a QUIC packet (first byte >= 0x40) or a PUNCH_GO frame; the rendezvous
never looks inside it. Punch MACs are HMAC-SHA256 (truncated to 16 bytes) under a key derived from
the join code's secret, so only session members can steer a peer's direct path. A punch frame's
stamp is its sender's clock in milliseconds, strictly increasing per sender: the receiver keeps
a replay window over it (kafila.net.punch), so a frame is acted on once and only while fresh;
no clocks need to agree.
Limits: a datagram is at most MAX_DATAGRAM bytes; a control JSON body at most MAX_CONTROL_BODY.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from kafila.errors import ProtocolError

REQUEST = 0x10
RESPONSE = 0x11
RELAY = 0x20
RELAYED = 0x21
PUNCH = 0x30
PUNCH_ACK = 0x31
PUNCH_GO = 0x32

ID_LEN = 8
NONCE_LEN = 8
MAC_LEN = 16
# relayed QUIC datagrams are <= 1,452 bytes (kafila.net.pmtu.DEFAULT_CEILING), plus our 9-byte envelope
MAX_DATAGRAM = 1500
MAX_CONTROL_BODY = 1400
_PUNCH_LEN = 1 + ID_LEN + ID_LEN + 8 + NONCE_LEN + MAC_LEN
MAX_STAMP = 2**64 - 1


def kind_of(data: bytes) -> str:
    """Which protocol a datagram belongs to: 'stun', 'kafila' or 'quic' (by its first byte)."""
    if not data:
        raise ProtocolError("empty datagram")
    b = data[0]
    if b <= 0x03:
        return "stun"
    if b <= 0x3F:
        return "kafila"
    return "quic"


@dataclass(frozen=True)
class Control:
    """A control REQUEST or RESPONSE: request id plus a JSON object."""

    kind: int
    request_id: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Relay:
    """A RELAY (peer = destination) or RELAYED (peer = source) envelope around an opaque payload."""

    kind: int
    peer: bytes
    payload: bytes


@dataclass(frozen=True)
class Punch:
    """A PUNCH, PUNCH_ACK or PUNCH_GO frame between two members of one session."""

    kind: int
    sender: bytes
    receiver: bytes
    stamp: int  # the sender's clock in ms, strictly increasing per sender
    nonce: bytes  # fresh per PUNCH / PUNCH_GO; in a PUNCH_ACK, the nonce of the PUNCH it answers
    mac: bytes


Frame = Control | Relay | Punch


def encode_control(kind: int, request_id: int, body: dict[str, Any]) -> bytes:
    """Serialise a control message; refuses bodies over the size limit."""
    if kind not in (REQUEST, RESPONSE):
        raise ValueError(f"not a control kind: {kind:#x}")
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    if len(raw) > MAX_CONTROL_BODY:
        raise ProtocolError(f"control message of {len(raw)} bytes exceeds {MAX_CONTROL_BODY}")
    return struct.pack("!BI", kind, request_id & 0xFFFFFFFF) + raw


def encode_relay(kind: int, peer: bytes, payload: bytes) -> bytes:
    """Serialise a RELAY or RELAYED envelope."""
    if kind not in (RELAY, RELAYED) or len(peer) != ID_LEN:
        raise ValueError("bad relay envelope")
    if 1 + ID_LEN + len(payload) > MAX_DATAGRAM:
        raise ProtocolError(f"relay payload of {len(payload)} bytes is too large")
    return bytes([kind]) + peer + payload


def encode_punch(p: Punch) -> bytes:
    """Serialise a punch-family frame."""
    if p.kind not in (PUNCH, PUNCH_ACK, PUNCH_GO):
        raise ValueError("not a punch kind")
    if (len(p.sender), len(p.receiver), len(p.nonce), len(p.mac)) != (ID_LEN, ID_LEN, NONCE_LEN, MAC_LEN):
        raise ValueError("bad punch field length")
    if not 0 <= p.stamp <= MAX_STAMP:
        raise ValueError("punch stamp out of range")
    return bytes([p.kind]) + p.sender + p.receiver + struct.pack("!Q", p.stamp) + p.nonce + p.mac


def punch_mac_input(kind: int, sender: bytes, receiver: bytes, stamp: int, nonce: bytes) -> bytes:
    """The bytes a punch MAC covers: everything in the frame but the MAC."""
    return b"kafila-punch-v2" + bytes([kind]) + sender + receiver + struct.pack("!Q", stamp) + nonce


def decode(data: bytes) -> Frame:
    """Parse one Kafila frame (first byte 0x04-0x3F); ProtocolError says what is wrong."""
    if not data:
        raise ProtocolError("empty frame")
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_DATAGRAM}")
    kind = data[0]
    if kind in (REQUEST, RESPONSE):
        if len(data) < 5:
            raise ProtocolError("control frame shorter than its header")
        (request_id,) = struct.unpack_from("!I", data, 1)
        raw = data[5:]
        if len(raw) > MAX_CONTROL_BODY:
            raise ProtocolError("control body too large")
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ProtocolError(f"control body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ProtocolError("control body is not a JSON object")
        return Control(kind, request_id, body)
    if kind in (RELAY, RELAYED):
        if len(data) < 1 + ID_LEN + 1:
            raise ProtocolError("relay frame without a payload")
        return Relay(kind, bytes(data[1 : 1 + ID_LEN]), bytes(data[1 + ID_LEN :]))
    if kind in (PUNCH, PUNCH_ACK, PUNCH_GO):
        if len(data) != _PUNCH_LEN:
            raise ProtocolError(f"punch frame of {len(data)} bytes, expected {_PUNCH_LEN}")
        o = 1
        sender, o = data[o : o + ID_LEN], o + ID_LEN
        receiver, o = data[o : o + ID_LEN], o + ID_LEN
        (stamp,) = struct.unpack_from("!Q", data, o)
        o += 8
        nonce, o = data[o : o + NONCE_LEN], o + NONCE_LEN
        return Punch(kind, bytes(sender), bytes(receiver), stamp, bytes(nonce), bytes(data[o:]))
    raise ProtocolError(f"unknown Kafila frame type {kind:#04x}")


# ---- JSON field helpers: every control field is checked, with the field named in the error ----


def get_str(body: dict[str, Any], key: str, max_len: int = 256) -> str:
    """A string field, bounded."""
    v = body.get(key)
    if not isinstance(v, str) or len(v) > max_len:
        raise ProtocolError(f"field {key!r} must be a string of at most {max_len} characters")
    return v


def get_int(body: dict[str, Any], key: str, lo: int = 0, hi: int = 2**31) -> int:
    """An integer field within [lo, hi]."""
    v = body.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ProtocolError(f"field {key!r} must be an integer in [{lo}, {hi}]")
    return v


def get_hex(body: dict[str, Any], key: str, nbytes: int) -> bytes:
    """A hex field of exactly nbytes bytes."""
    v = get_str(body, key, 2 * nbytes)
    try:
        raw = bytes.fromhex(v)
    except ValueError:
        raise ProtocolError(f"field {key!r} is not hex") from None
    if len(raw) != nbytes:
        raise ProtocolError(f"field {key!r} must be {nbytes} bytes")
    return raw


def get_addr(value: Any, what: str) -> tuple[str, int]:
    """An [ip, port] pair."""
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or len(value[0]) > 64
        or not isinstance(value[1], int)
        or isinstance(value[1], bool)
        or not 0 <= value[1] <= 65535
    ):
        raise ProtocolError(f"{what} must be [ip, port]")
    return (value[0], value[1])

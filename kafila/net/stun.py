"""A minimal STUN codec (RFC 5389 header, RFC 5780 attributes) for NAT-behaviour probes.

Wire format (big-endian):

    u16 type (0x0001 Binding request, 0x0101 Binding success) | u16 body length | u32 magic 0x2112A442
    | 12-byte transaction id | attributes: u16 type | u16 length | value, padded to 4 bytes

Attributes used:
    0x0003 CHANGE-REQUEST     u32 flags: 0x04 answer from the other IP, 0x02 from the other port
    0x0020 XOR-MAPPED-ADDRESS the source address the server saw (XORed with the magic cookie)
    0x802B RESPONSE-ORIGIN    the address the answer was sent from
    0x802C OTHER-ADDRESS      the server's alternate IP (and port), when it has one
    0x0026 PADDING            zeros: a request is padded to REQUEST_SIZE bytes, no smaller than any
                              answer, so the rendezvous answers no spoofed source with more than it sent
Unknown attributes are skipped; malformed ones raise ProtocolError.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from kafila.errors import ProtocolError

MAGIC = 0x2112A442
BINDING_REQUEST = 0x0001
BINDING_SUCCESS = 0x0101
CHANGE_REQUEST = 0x0003
XOR_MAPPED_ADDRESS = 0x0020
RESPONSE_ORIGIN = 0x802B
OTHER_ADDRESS = 0x802C
PADDING = 0x0026
REQUEST_SIZE = 96  # the largest answer: header and three IPv6 address attributes, 20 + 3 * 24 = 92
CHANGE_IP = 0x04
CHANGE_PORT = 0x02
MAX_STUN = 548  # a request or answer is far smaller; refuse anything larger

Addr = tuple[str, int]


@dataclass(frozen=True)
class StunMessage:
    """A Binding request or success response with the attributes Kafila uses."""

    msg_type: int
    txid: bytes
    change: int = 0
    mapped: Addr | None = None
    origin: Addr | None = None
    other: Addr | None = None


def is_stun(data: bytes) -> bool:
    """True when the datagram looks like STUN: first two bits 00 and the magic cookie in place."""
    return len(data) >= 20 and data[0] <= 0x03 and data[4:8] == MAGIC.to_bytes(4, "big")


def _pack_addr(attr: int, addr: Addr, xor: bool, txid: bytes) -> bytes:
    ip = ipaddress.ip_address(addr[0])
    port = addr[1]
    raw = ip.packed
    if xor:
        port ^= MAGIC >> 16
        key = MAGIC.to_bytes(4, "big") + txid
        raw = bytes(a ^ b for a, b in zip(raw, key, strict=False))
    family = 0x01 if ip.version == 4 else 0x02
    value = struct.pack("!BBH", 0, family, port) + raw
    return struct.pack("!HH", attr, len(value)) + value


def _unpack_addr(value: bytes, xor: bool, txid: bytes) -> Addr:
    if len(value) < 4:
        raise ProtocolError("STUN address attribute too short")
    _, family, port = struct.unpack_from("!BBH", value)
    raw = value[4:]
    if (family, len(raw)) not in ((0x01, 4), (0x02, 16)):
        raise ProtocolError("STUN address attribute has a bad family or length")
    if xor:
        port ^= MAGIC >> 16
        key = MAGIC.to_bytes(4, "big") + txid
        raw = bytes(a ^ b for a, b in zip(raw, key, strict=False))
    return (str(ipaddress.ip_address(raw)), port)


def encode(msg: StunMessage) -> bytes:
    """Serialise a STUN message."""
    if len(msg.txid) != 12:
        raise ValueError("STUN transaction id must be 12 bytes")
    attrs = b""
    if msg.change:
        attrs += struct.pack("!HHI", CHANGE_REQUEST, 4, msg.change)
    if msg.mapped:
        attrs += _pack_addr(XOR_MAPPED_ADDRESS, msg.mapped, True, msg.txid)
    if msg.origin:
        attrs += _pack_addr(RESPONSE_ORIGIN, msg.origin, False, msg.txid)
    if msg.other:
        attrs += _pack_addr(OTHER_ADDRESS, msg.other, False, msg.txid)
    if msg.msg_type == BINDING_REQUEST and 20 + len(attrs) < REQUEST_SIZE:
        pad = REQUEST_SIZE - 20 - len(attrs) - 4
        attrs += struct.pack("!HH", PADDING, pad) + bytes(pad)
    return struct.pack("!HHI", msg.msg_type, len(attrs), MAGIC) + msg.txid + attrs


def decode(data: bytes) -> StunMessage:
    """Parse a STUN Binding request or success; ProtocolError on anything malformed."""
    if len(data) > MAX_STUN:
        raise ProtocolError(f"STUN message of {len(data)} bytes is too large")
    if not is_stun(data):
        raise ProtocolError("not a STUN message (bad first byte, length or magic cookie)")
    msg_type, length = struct.unpack_from("!HH", data)
    if msg_type not in (BINDING_REQUEST, BINDING_SUCCESS):
        raise ProtocolError(f"unsupported STUN message type {msg_type:#06x}")
    if length != len(data) - 20 or length % 4:
        raise ProtocolError("STUN length field does not match the datagram")
    txid = bytes(data[8:20])
    fields: dict[str, object] = {}
    o = 20
    while o < len(data):
        if o + 4 > len(data):
            raise ProtocolError("truncated STUN attribute header")
        attr, alen = struct.unpack_from("!HH", data, o)
        value = bytes(data[o + 4 : o + 4 + alen])
        if len(value) != alen:
            raise ProtocolError("truncated STUN attribute")
        o += 4 + alen + (-alen % 4)
        if attr == CHANGE_REQUEST:
            if alen != 4:
                raise ProtocolError("CHANGE-REQUEST must be 4 bytes")
            fields["change"] = struct.unpack("!I", value)[0] & (CHANGE_IP | CHANGE_PORT)
        elif attr == XOR_MAPPED_ADDRESS:
            fields["mapped"] = _unpack_addr(value, True, txid)
        elif attr == RESPONSE_ORIGIN:
            fields["origin"] = _unpack_addr(value, False, txid)
        elif attr == OTHER_ADDRESS:
            fields["other"] = _unpack_addr(value, False, txid)
    return StunMessage(msg_type, txid, **fields)  # type: ignore[arg-type]

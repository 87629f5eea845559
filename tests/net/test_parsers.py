"""Every parser: round trips, and hypothesis fuzzing (no crash, no hang, a clear ProtocolError)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError, SessionError
from kafila.net import stun, wire
from kafila.net.trust import JoinCode, open_announcement

FUZZ = settings(max_examples=500, deadline=None)


def test_stun_round_trip() -> None:
    m = stun.StunMessage(stun.BINDING_SUCCESS, b"t" * 12, mapped=("100.64.0.11", 40000),
                         origin=("100.64.0.3", 3479), other=("100.64.0.3", 3479))
    assert stun.decode(stun.encode(m)) == m
    r = stun.StunMessage(stun.BINDING_REQUEST, b"u" * 12, change=stun.CHANGE_IP | stun.CHANGE_PORT)
    assert stun.decode(stun.encode(r)) == r
    assert wire.kind_of(stun.encode(r)) == "stun"


def test_wire_round_trips() -> None:
    c = wire.encode_control(wire.REQUEST, 42, {"op": "ping"})
    assert wire.decode(c) == wire.Control(wire.REQUEST, 42, {"op": "ping"})
    r = wire.encode_relay(wire.RELAY, b"p" * 8, b"\x40payload")
    assert wire.decode(r) == wire.Relay(wire.RELAY, b"p" * 8, b"\x40payload")
    p = wire.Punch(wire.PUNCH, b"a" * 8, b"b" * 8, 2**64 - 1, b"n" * 8, b"m" * 16)
    assert wire.decode(wire.encode_punch(p)) == p
    for data in (c, r, wire.encode_punch(p)):
        assert 0x04 <= data[0] <= 0x3F


def test_control_body_too_large_is_refused() -> None:
    with pytest.raises(ProtocolError):
        wire.encode_control(wire.REQUEST, 1, {"x": "y" * 2000})


@FUZZ
@given(st.binary(max_size=700))
def test_fuzz_stun(data: bytes) -> None:
    try:
        stun.decode(data)
    except ProtocolError:
        pass


@FUZZ
@given(st.binary(min_size=20, max_size=200))
def test_fuzz_stun_with_valid_header(tail: bytes) -> None:
    body = tail[: len(tail) - len(tail) % 4]
    data = (0x0101).to_bytes(2, "big") + len(body).to_bytes(2, "big") + stun.MAGIC.to_bytes(4, "big") + b"t" * 12 + body
    try:
        stun.decode(data)
    except ProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=1600))
def test_fuzz_wire(data: bytes) -> None:
    try:
        wire.decode(data)
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from([0x10, 0x11, 0x20, 0x21, 0x30, 0x31, 0x32]), st.binary(max_size=64))
def test_fuzz_wire_known_types(kind: int, rest: bytes) -> None:
    try:
        wire.decode(bytes([kind]) + rest)
    except ProtocolError:
        pass


@FUZZ
@given(st.text(max_size=2000))
def test_fuzz_announcement(text: str) -> None:
    code = JoinCode("abcdefgh", "0123456789abcdef")
    try:
        open_announcement(text, code, b"m" * 8)
    except (ProtocolError, SessionError):
        pass


@FUZZ
@given(st.text(max_size=60))
def test_fuzz_join_code(text: str) -> None:
    try:
        JoinCode.parse(text)
    except SessionError:
        pass


@FUZZ
@given(st.sampled_from([wire.PUNCH, wire.PUNCH_ACK, wire.PUNCH_GO]), st.binary(min_size=8, max_size=8),
       st.binary(min_size=8, max_size=8), st.integers(0, 2**64 - 1), st.binary(min_size=8, max_size=8),
       st.binary(min_size=16, max_size=16))
def test_punch_frames_round_trip(kind: int, sender: bytes, receiver: bytes, stamp: int, nonce: bytes,
                                 mac: bytes) -> None:
    p = wire.Punch(kind, sender, receiver, stamp, nonce, mac)
    data = wire.encode_punch(p)
    assert wire.decode(data) == p and wire.kind_of(data) == "kafila"
    with pytest.raises(ProtocolError):
        wire.decode(data[:-1])
    with pytest.raises(ProtocolError):
        wire.decode(data + b"\0")


@FUZZ
@given(st.binary(min_size=48, max_size=48))
def test_fuzz_punch_sized_frames(body: bytes) -> None:
    """Any 49 bytes starting with a punch kind parse (the MAC, not the parser, decides what is genuine)."""
    for kind in (wire.PUNCH, wire.PUNCH_ACK, wire.PUNCH_GO):
        frame = wire.decode(bytes([kind]) + body)
        assert isinstance(frame, wire.Punch) and wire.encode_punch(frame) == bytes([kind]) + body


def test_punch_stamp_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="stamp"):
        wire.encode_punch(wire.Punch(wire.PUNCH, b"a" * 8, b"b" * 8, 2**64, b"n" * 8, b"m" * 16))

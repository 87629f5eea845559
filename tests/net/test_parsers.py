"""Every parser: round trips, and hypothesis fuzzing: no crash, no hang, a clear ProtocolError, and every input a
parser accepts has its fields where the documented layout puts them (read here by hand) and reads back."""

from __future__ import annotations

import base64
import ipaddress
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError, SessionError
from kafila.net import stun, wire
from kafila.net.trust import JoinCode, open_announcement
from tests.fuzzing import refused_or_checked

pytestmark = pytest.mark.fast

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


# ---- what every accepted input satisfies (written from the layouts in the modules' docstrings) ----------------

CODE_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, as kafila.net.trust documents it


def check_accepted_stun(data: bytes, msg: stun.StunMessage) -> None:
    """A STUN message decode() accepted: RFC 5389's header, attributes in range, a canonical form that reads back."""
    assert 20 <= len(data) <= stun.MAX_STUN and len(data) % 4 == 0
    assert data[4:8] == bytes.fromhex("2112A442") and int.from_bytes(data[2:4], "big") == len(data) - 20
    assert msg.msg_type == int.from_bytes(data[:2], "big") and msg.msg_type in (0x0001, 0x0101)
    assert msg.txid == data[8:20]
    assert msg.change in (0, 0x02, 0x04, 0x06)  # only the two flags of RFC 5780's CHANGE-REQUEST
    for addr in (msg.mapped, msg.origin, msg.other):
        if addr is not None:
            assert str(ipaddress.ip_address(addr[0])) == addr[0] and 0 <= addr[1] <= 0xFFFF
    assert stun.decode(stun.encode(msg)) == msg


def check_accepted_frame(data: bytes, frame: wire.Frame) -> None:
    """A Kafila frame decode() accepted: its fields where the layout puts them, and it encodes to what came in."""
    assert 0x04 <= data[0] <= 0x3F and len(data) <= wire.MAX_DATAGRAM and frame.kind == data[0]
    if isinstance(frame, wire.Relay):
        assert frame.kind in (0x20, 0x21) and frame.peer == data[1:9] and frame.payload == data[9:] != b""
        assert wire.encode_relay(frame.kind, frame.peer, frame.payload) == data
    elif isinstance(frame, wire.Punch):
        assert frame.kind in (0x30, 0x31, 0x32) and len(data) == 49
        assert (frame.sender, frame.receiver, frame.nonce, frame.mac) == (data[1:9], data[9:17], data[25:33], data[33:])
        assert frame.stamp == int.from_bytes(data[17:25], "big")
        assert wire.encode_punch(frame) == data
    else:
        assert frame.kind in (0x10, 0x11) and frame.request_id == int.from_bytes(data[1:5], "big")
        assert isinstance(frame.body, dict) and len(data) - 5 <= wire.MAX_CONTROL_BODY
        canonical = json.dumps(frame.body, sort_keys=True)  # NaN != NaN: compare the JSON texts
        assert canonical == json.dumps(json.loads(data[5:].decode("utf-8")), sort_keys=True)
        try:
            again = wire.encode_control(frame.kind, frame.request_id, frame.body)
        except ProtocolError:  # its canonical form (\u escapes) can outgrow the limit; the input was within it
            return
        back = wire.decode(again)
        assert isinstance(back, wire.Control) and (back.kind, back.request_id) == (frame.kind, frame.request_id)
        assert json.dumps(back.body, sort_keys=True) == canonical


def rfc_address(attr: int, addr: tuple[str, int], xor: bool, txid: bytes) -> bytes:
    """One address attribute as RFC 5389 §15.1-15.2 lays it out (the XOR form keyed by the cookie and txid)."""
    ip = ipaddress.ip_address(addr[0])
    raw, port = ip.packed, addr[1]
    if xor:
        port ^= 0x2112
        raw = bytes(a ^ b for a, b in zip(raw, bytes.fromhex("2112A442") + txid, strict=False))
    value = bytes([0, 1 if ip.version == 4 else 2]) + port.to_bytes(2, "big") + raw
    return attr.to_bytes(2, "big") + len(value).to_bytes(2, "big") + value


ADDRESSES = st.tuples(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str), st.integers(0, 0xFFFF))


@st.composite
def stun_datagrams(draw: st.DrawFn) -> tuple[bytes, stun.StunMessage | None]:
    """A well-formed STUN datagram and what it says (None: a message type Kafila does not take)."""
    msg_type = draw(st.sampled_from([0x0001, 0x0101, 0x0111, 0x0002]))
    txid = draw(st.binary(min_size=12, max_size=12))
    attrs, fields = b"", {}
    for _ in range(draw(st.integers(0, 6))):
        what = draw(st.sampled_from(["change", "mapped", "origin", "other", "unknown"]))
        if what == "change":
            flags = draw(st.integers(0, 2**32 - 1))
            attrs += bytes.fromhex("00030004") + flags.to_bytes(4, "big")
            fields["change"] = flags & 0x06
        elif what == "unknown":  # skipped, whatever it holds; padded to 4 bytes
            value = draw(st.binary(max_size=20))
            attrs += draw(st.sampled_from([0x8022, 0x0006, 0xC057])).to_bytes(2, "big") + len(value).to_bytes(2, "big")
            attrs += value + b"\0" * (-len(value) % 4)
        else:
            addr = draw(ADDRESSES)
            code = {"mapped": 0x0020, "origin": 0x802B, "other": 0x802C}[what]
            attrs += rfc_address(code, addr, what == "mapped", txid)
            fields[what] = addr
    data = msg_type.to_bytes(2, "big") + len(attrs).to_bytes(2, "big") + bytes.fromhex("2112A442") + txid + attrs
    if msg_type not in (0x0001, 0x0101):
        return data, None
    return data, stun.StunMessage(msg_type, txid, **fields)  # type: ignore[arg-type]


def damaged(good: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Datagrams of `good` with a few bytes changed, cut short or extended."""
    @st.composite
    def damage(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(good))
        for _ in range(draw(st.integers(0, 3))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        cut = draw(st.integers(0, len(data)))
        return bytes(data[:cut] if draw(st.booleans()) else data) + draw(st.binary(max_size=8))
    return damage()


@FUZZ
@given(st.one_of(st.binary(max_size=700), damaged(stun_datagrams().map(lambda d: d[0]))))
def test_fuzz_stun(data: bytes) -> None:
    refused_or_checked(data, stun.decode, check_accepted_stun)


@FUZZ
@given(st.binary(min_size=20, max_size=200))
def test_fuzz_stun_with_valid_header(tail: bytes) -> None:
    body = tail[: len(tail) - len(tail) % 4]
    data = (0x0101).to_bytes(2, "big") + len(body).to_bytes(2, "big") + stun.MAGIC.to_bytes(4, "big") + b"t" * 12 + body
    refused_or_checked(data, stun.decode, check_accepted_stun)


@FUZZ
@given(stun_datagrams())
def test_well_formed_stun_reads_as_rfc_5389_lays_it_out(case: tuple[bytes, stun.StunMessage | None]) -> None:
    """Datagrams built from the RFC's layout, not by stun.encode: decode() gives the fields they were built from."""
    data, expected = case
    if expected is None:
        with pytest.raises(ProtocolError, match="unsupported STUN message type"):
            stun.decode(data)
        return
    assert stun.decode(data) == expected
    check_accepted_stun(data, expected)


CONTROL_BODIES = st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=8) | st.floats() | st.none(),
                                 max_size=4).map(lambda d: json.dumps(d).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=1600), damaged(st.one_of(
    st.tuples(st.sampled_from([0x10, 0x11]), st.binary(min_size=4, max_size=4), CONTROL_BODIES).map(
        lambda t: bytes([t[0]]) + t[1] + t[2]),
    st.tuples(st.sampled_from([0x20, 0x21]), st.binary(min_size=9, max_size=1600)).map(lambda t: bytes([t[0]]) + t[1]),
    st.tuples(st.sampled_from([0x30, 0x31, 0x32]), st.binary(min_size=48, max_size=48)).map(
        lambda t: bytes([t[0]]) + t[1]),
))))
def test_fuzz_wire(data: bytes) -> None:
    refused_or_checked(data, wire.decode, check_accepted_frame)


@FUZZ
@given(st.sampled_from([0x10, 0x11, 0x20, 0x21, 0x30, 0x31, 0x32]),
       st.one_of(st.binary(max_size=64), st.tuples(st.binary(min_size=4, max_size=4), CONTROL_BODIES).map(
           lambda t: t[0] + t[1])))
def test_fuzz_wire_known_types(kind: int, rest: bytes) -> None:
    data = bytes([kind]) + rest
    refused_or_checked(data, wire.decode, check_accepted_frame)


@st.composite
def sealed_looking(draw: st.DrawFn) -> str:
    """Base64 of what a sealed announcement's layout holds (version, nonce, JSON, tag), made without the key."""
    body = json.dumps({"v": 2, "session": "abcdefgh", "member": (b"m" * 8).hex(), "name": draw(st.text(max_size=8)),
                       "fp": "ab" * 32, "nat": "ordinary", "mapped": None, "local": None, "rtt_ms": None, "m": {},
                       "t": 1.0}).encode()
    blob = bytes([draw(st.sampled_from([2, 2, 1]))]) + draw(st.binary(min_size=12, max_size=12)) + body
    return base64.b64encode(blob + draw(st.binary(min_size=16, max_size=16))).decode()


@FUZZ
@given(st.one_of(st.text(max_size=2000), sealed_looking()))
def test_fuzz_announcement(text: str) -> None:
    """Nothing made without the join code's secret is accepted: every such text is refused, and as what it is."""
    code = JoinCode("abcdefgh", "0123456789abcdef")
    with pytest.raises((ProtocolError, SessionError)):
        open_announcement(text, code, b"m" * 8, now=2.0)


@st.composite
def typed_codes(draw: st.DrawFn) -> str:
    """A join code as a person might type it: any case, separators anywhere, 1 as i or l, 0 as o; maybe a typo."""
    chars = draw(st.lists(st.sampled_from(CODE_ALPHABET), min_size=24, max_size=24))
    out = ""
    for c in chars:
        c = {"1": draw(st.sampled_from("1iIlL")), "0": draw(st.sampled_from("0oO"))}.get(c, c)
        out += (c.upper() if draw(st.booleans()) else c) + draw(st.sampled_from(["", "", "", "-", " ", "_", "\t"]))
    if draw(st.integers(0, 5)) == 0:  # a typo: a letter outside the alphabet, or one too many or too few
        i = draw(st.integers(0, len(out)))
        out = out[:i] + draw(st.sampled_from(["u", "x7", "", "!"])) + out[i + 1:]
    return draw(st.sampled_from(["", " ", "\n"])) + out + draw(st.sampled_from(["", " ", "\n"]))


@FUZZ
@given(st.one_of(st.text(max_size=60), typed_codes()))
def test_fuzz_join_code(text: str) -> None:
    # what the person typed, read by hand: separators and case dropped, the confusable letters as their digits
    typed = "".join({"i": "1", "l": "1", "o": "0"}.get(c, c) for c in text.lower() if not (c.isspace() or c in "-_"))
    if len(typed) != 24 or not set(typed) <= set(CODE_ALPHABET):
        with pytest.raises(SessionError, match="malformed"):
            JoinCode.parse(text)
        return
    code = JoinCode.parse(text)
    assert (code.session_id, code.secret) == (typed[:8], typed[8:])
    assert re.fullmatch(r"[0-9a-z]{8}(-[0-9a-z]{4}){4}", str(code)) and JoinCode.parse(str(code)) == code


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

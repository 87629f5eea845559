"""RendezvousCore with in-memory members and an injected clock."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import RENDEZVOUS_CODES, ProtocolError
from kafila.net import registration, stun, wire
from rendezvous.core import Limits, RendezvousCore, Session
from tests.rendezvous.asking import OTHER_SECRET, SECRET, create_body, echoing_cookie, join_for

pytestmark = pytest.mark.fast

A, A2, B, B2 = ("100.64.0.2", 3478), ("100.64.0.2", 3479), ("100.64.0.3", 3478), ("100.64.0.3", 3479)


def core(**kw: object) -> RendezvousCore:
    return RendezvousCore([A, A2, B, B2], Limits(**kw))  # type: ignore[arg-type]


def ask(c: RendezvousCore, body: dict, src=("10.0.0.1", 5000), now=0.0, rid=1) -> dict:
    _, reply = echoing_cookie(c, body, src, A, now, rid)
    assert reply is not None
    return reply


def new_session(c: RendezvousCore, now: float = 0.0) -> str:
    r = ask(c, create_body(), now=now, rid=99)
    assert r["ok"], r
    return r["session"]


def join(c, sid, mid: bytes, src, now=0.0, secret=SECRET, rid=2):
    return ask(c, join_for(sid, mid, secret), src, now, rid)


def test_probe_answers_from_the_socket_asked_for() -> None:
    c = core()
    txid = b"x" * 12
    for flags, origin in [(0, A), (stun.CHANGE_PORT, A2), (stun.CHANGE_IP, B), (stun.CHANGE_IP | stun.CHANGE_PORT, B2)]:
        req = stun.encode(stun.StunMessage(stun.BINDING_REQUEST, txid, change=flags))
        [(data, via, dst)] = c.handle(req, ("1.2.3.4", 999), A, 0.0)
        msg = stun.decode(data)
        assert via == origin and dst == ("1.2.3.4", 999)
        assert msg.mapped == ("1.2.3.4", 999) and msg.origin == origin and msg.other == B2


def test_probe_without_alt_ip_stays_silent_for_change_ip() -> None:
    c = RendezvousCore([A, A2])
    req = stun.encode(stun.StunMessage(stun.BINDING_REQUEST, b"y" * 12, change=stun.CHANGE_IP))
    assert c.handle(req, ("1.2.3.4", 999), A, 0.0) == []


def test_join_wrong_code_is_refused_clearly() -> None:
    c = core()
    sid = new_session(c)
    r = join(c, sid, b"m" * 8, ("10.0.0.1", 1), secret=OTHER_SECRET)
    assert r == {"ok": False, "code": "wrong_code", "error": "wrong join code for this session"}
    r = join(c, "zzzzzzzz", b"m" * 8, ("10.0.0.1", 1), rid=3)
    assert r["ok"] is False and r["code"] == "unknown_session"
    assert "zzzzzzzz" not in r.get("error", "")  # nothing of the request comes back


def test_announce_list_and_relay() -> None:
    c = core()
    sid = new_session(c)
    a, b = ("10.0.0.1", 1000), ("10.0.0.2", 2000)
    keys = {mid: registration.reg_key_of(join(c, sid, mid, src)) for mid, src in ((b"a" * 8, a), (b"b" * 8, b))}
    for mid, src in ((b"a" * 8, a), (b"b" * 8, b)):
        ann = base64.b64encode(mid * 10).decode()
        body = {"op": "announce", "session": sid, "member": mid.hex(), "ann": ann}
        assert ask(c, registration.signed(body, keys[mid], 1), src, rid=3)["ok"]
    body = {"op": "list", "session": sid, "member": (b"a" * 8).hex(), "start": 0}
    r = ask(c, registration.signed(body, keys[b"a" * 8], 2), a, rid=4)
    assert r["total"] == 2 and [m["id"] for m in r["members"]] == [(b"a" * 8).hex(), (b"b" * 8).hex()]
    assert r["members"][1]["obs"] == list(b)
    out = c.handle(wire.encode_relay(wire.RELAY, b"b" * 8, b"\x45secret"), a, A, 1.0)
    assert out == [(wire.encode_relay(wire.RELAYED, b"a" * 8, b"\x45secret"), A, b)]
    # a stranger cannot use the relay, nor reach a member of another session
    assert c.handle(wire.encode_relay(wire.RELAY, b"b" * 8, b"\x45x"), ("9.9.9.9", 1), A, 1.0) == []
    assert c.stats.relayed == 1


def test_retry_gets_the_cached_answer() -> None:
    c = core()
    body = create_body(OTHER_SECRET)
    r1 = ask(c, body, rid=7)
    r2 = ask(c, body, rid=7)
    assert r1 == r2 and len(c.sessions) == 1


def test_bounds_sessions_members_and_rate() -> None:
    c = core(max_sessions=3, max_members=2, join_source_burst=100, join_ip_burst=100)
    sids: list[str] = []
    for i in range(3):
        r = ask(c, create_body(), rid=10 + i)
        assert r["ok"]
        sids.append(r["session"])
    assert join(c, sids[0], b"1" * 8, ("10.0.0.1", 1))["ok"]
    assert join(c, sids[0], b"2" * 8, ("10.0.9.1", 2))["ok"]  # a second site (another /24): sids[0] is in use
    r = join(c, sids[0], b"3" * 8, ("10.0.0.1", 3))
    assert r["ok"] is False and r["code"] == "full" and "session is full" in r["error"]
    assert join(c, sids[2], b"1" * 8, ("10.0.0.2", 1), now=1.0)["ok"]  # sids[2] waits, but was active later
    # full: the idlest session no second address joined (sids[1]) makes room for a new one
    r = ask(c, create_body(), now=2.0, rid=20)
    assert r["ok"] and sorted(c.sessions) == sorted([sids[0], sids[2], r["session"]])
    # every session in use (joined from two sites): then a create is refused
    for i, (sid, mid) in enumerate([(sids[2], b"2"), (r["session"], b"1"), (r["session"], b"2")]):
        assert join(c, sid, mid * 8, (f"10.0.{1 + i}.1", 10 + i), now=3.0, rid=30 + i)["ok"]
    r = ask(c, create_body(OTHER_SECRET), now=4.0, rid=40)
    assert r["ok"] is False and r["code"] == "full" and len(c.sessions) == 3
    # join rate per source address
    c2 = core(join_source_burst=3, join_source_rate=0.0)
    sid = new_session(c2)
    results = [join(c2, sid, bytes([i]) * 8, ("10.9.9.9", 7), rid=100 + i)["ok"] for i in range(5)]
    assert results == [True, True, True, False, False]
    assert c2.stats.rate_limited == 2


def test_silent_members_and_idle_sessions_expire() -> None:
    c = core(member_timeout_s=10, empty_session_ttl_s=20)
    sid = new_session(c, now=0.0)
    src = ("10.0.0.1", 1)
    key = registration.reg_key_of(join(c, sid, b"a" * 8, src, now=0.0))
    ping = registration.signed({"op": "ping", "session": sid, "member": (b"a" * 8).hex()}, key, 1)
    assert ask(c, ping, src, now=8.0, rid=5)["ok"]
    c.expire(17.0)
    assert b"a" * 8 in c.sessions[sid].members  # pinged at 8: still alive at 17
    c.expire(19.0)
    assert not c.sessions[sid].members and src not in c.by_addr
    c.expire(40.0)
    assert sid not in c.sessions


def test_unknown_op_and_bad_fields_answer_errors() -> None:
    c = core()
    r = ask(c, {"op": "explode", "pad": "x" * 60})
    assert r == {"ok": False, "code": "bad_request", "error": "unknown op"}  # the op is not echoed
    r = ask(c, {"op": "create", "join_pub": "xyz", "pad": "x" * 60}, rid=2)
    assert r["code"] == "bad_request" and "join_pub" in r["error"]


STRANGER = ("10.0.0.9", 9)


@st.composite
def datagrams(draw: st.DrawFn) -> bytes:
    """Anything a stranger could send: random bytes, STUN, control requests and answers, relay envelopes, QUIC."""
    kind = draw(st.sampled_from(["bytes", "stun", "control", "relay", "quic"]))
    if kind == "stun":
        msg_type = draw(st.sampled_from([stun.BINDING_REQUEST, stun.BINDING_REQUEST, stun.BINDING_SUCCESS]))
        change = draw(st.sampled_from([0, stun.CHANGE_PORT, stun.CHANGE_IP, stun.CHANGE_IP | stun.CHANGE_PORT]))
        data = stun.encode(stun.StunMessage(msg_type, draw(st.binary(min_size=12, max_size=12)), change=change))
        return data + draw(st.sampled_from([b"", b"", b"\0\0\0\0", b"x"]))  # an unknown attribute, or damage
    if kind == "control":
        body = draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=5))
        body = draw(st.sampled_from([body, {**body, "op": "create", "join_pub": "00" * 32}]))
        try:
            return wire.encode_control(draw(st.sampled_from([wire.REQUEST, wire.RESPONSE])),
                                       draw(st.integers(0, 2**32 - 1)), body)
        except (ProtocolError, ValueError):
            return b"\x10" + json.dumps(body, default=str).encode()  # no request id: malformed
    if kind == "relay":
        peer = draw(st.sampled_from([b"a" * 8, b"b" * 8, bytes(8)]))
        payload = draw(st.binary(min_size=1, max_size=1600))
        return bytes([draw(st.sampled_from([wire.RELAY, wire.RELAYED]))]) + peer + payload
    if kind == "quic":
        return bytes([draw(st.integers(0x40, 0xFF))]) + draw(st.binary(max_size=1400))
    return draw(st.binary(max_size=1600))


@settings(max_examples=400, deadline=None)
@given(datagrams(), st.integers(0, 3))
def test_a_stranger_gets_only_bounded_answers_to_itself(data: bytes, sock: int) -> None:
    """Whatever a stranger (no session, no registration) sends, what comes back goes to it alone, from a socket
    of the rendezvous, within a datagram: a STUN answer from the socket its flags ask for (RFC 5780), naming
    the address it came from; one answer to a control request, a refusal no larger than the request unless it
    created a session; and nothing at all for relay envelopes, answers, QUIC or garbage."""
    c = core()
    local = [A, A2, B, B2][sock]
    out = c.handle(data, STRANGER, local, 0.0)
    assert len(out) <= 1
    for reply, via, dst in out:
        assert dst == STRANGER and via in (A, A2, B, B2) and len(reply) <= c.limits.max_datagram
    request = None
    if stun.is_stun(data) and data[:2] == b"\x00\x01":
        try:
            request = stun.decode(data)
        except ProtocolError:
            pass
    if request is not None:
        ((reply, via, _dst),) = out
        ip = {A[0]: B[0], B[0]: A[0]}[local[0]] if request.change & stun.CHANGE_IP else local[0]
        port = {3478: 3479, 3479: 3478}[local[1]] if request.change & stun.CHANGE_PORT else local[1]
        assert via == (ip, port)
        other = ({A[0]: B[0], B[0]: A[0]}[local[0]], {3478: 3479, 3479: 3478}[local[1]])
        assert stun.decode(reply) == stun.StunMessage(stun.BINDING_SUCCESS, request.txid, mapped=STRANGER,
                                                      origin=(ip, port), other=other)
        return
    frame = None
    if data[:1] in (b"\x10",):
        try:
            frame = wire.decode(data)
        except ProtocolError:
            pass
    if not isinstance(frame, wire.Control):
        assert out == [] and not c.sessions  # relay envelopes, answers, QUIC, garbage: silence, no state
        return
    if not out:  # refused, and even the shortest answer would have been larger than the request: a refusal cut
        # to its code, or (an op that makes state, without a cookie) the cookie it must echo first
        longest = max(len(json.dumps({"ok": False, "code": code}, separators=(",", ":"))) for code in RENDEZVOUS_CODES)
        ask_cookie = wire.encode_control(wire.RESPONSE, frame.request_id,
                                         {"ok": False, "code": "cookie", "cookie": "00" * registration.COOKIE_LEN})
        assert not c.sessions
        assert len(data) < 5 + longest or (frame.body.get("op") in registration.COOKIE_OPS
                                           and len(data) < len(ask_cookie))
        return
    ((reply, via, _dst),) = out
    answer = wire.decode(reply)
    assert via == local and isinstance(answer, wire.Control) and answer.kind == wire.RESPONSE
    assert answer.request_id == frame.request_id
    if answer.body["ok"] is True:  # only a create needs no registration
        assert frame.body["op"] == "create" and list(c.sessions) == [answer.body["session"]]
    else:
        assert answer.body["ok"] is False and answer.body["code"] in RENDEZVOUS_CODES and not c.sessions
        assert len(reply) <= len(data), "a refusal larger than its request"


def test_relay_rate_is_bounded_per_member() -> None:
    c = core(relay_burst=5, relay_rate=0.0)
    sid = new_session(c)
    a, b = ("10.0.0.1", 1000), ("10.0.0.2", 2000)
    join(c, sid, b"a" * 8, a, rid=2)
    join(c, sid, b"b" * 8, b, rid=3)
    sent = [len(c.handle(wire.encode_relay(wire.RELAY, b"b" * 8, b"\x45x"), a, A, 1.0)) for _ in range(8)]
    assert sent == [1] * 5 + [0] * 3


FIELDS = ["op", "session", "member", "proof", "join_pub", "cookie", "ann", "start", "nonce", "mac", "pad"]
OPS = ["create", "join", "challenge", "rejoin", "announce", "list", "ping", "leave"]
SID = "k7q2m9xd"  # the fuzzed core holds this session, with member "a"*8 registered from FUZZ_SRC
FUZZ_SRC = ("10.0.0.9", 9)
VALUES = st.one_of(
    st.text(max_size=80), st.integers(), st.floats(), st.none(), st.booleans(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from([*OPS, SID, (b"a" * 8).hex(), "00" * 64, "00" * 16, "00" * 32, "zz" * 16]),
)


def fuzz_core() -> RendezvousCore:
    c = core()
    c.sessions[SID] = Session(SID, bytes.fromhex(create_body()["join_pub"]), 0.0, 0.0, "10.0.0.9")
    assert join(c, SID, b"a" * 8, FUZZ_SRC, rid=77)["ok"]
    return c


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=7), st.integers(0, 2**32 - 1),
       st.sampled_from([FUZZ_SRC, ("10.0.0.8", 8)]))
def test_fuzz_control_bodies_get_a_bounded_answer(body: dict, rid: int, src: tuple[str, int]) -> None:
    c = fuzz_core()
    try:
        data = wire.encode_control(wire.REQUEST, rid, body)
    except (ProtocolError, ValueError):
        return  # not encodable (too large, NaN): no member could send it
    out = c.handle(data, src, A, 1.0)
    assert len(out) <= 1
    for reply, via, dst in out:
        assert via == A and dst == src and len(reply) <= c.limits.max_datagram
        frame = wire.decode(reply)
        assert isinstance(frame, wire.Control) and frame.request_id == rid
        if frame.body.get("ok") is not True:
            assert frame.body["ok"] is False and frame.body["code"] in RENDEZVOUS_CODES
            assert len(reply) <= len(data), "a refusal larger than its request"
        if src != FUZZ_SRC:  # a stranger (or a spoofed source) never gets more bytes than it sent
            assert len(reply) <= len(data), frame.body

"""Abuse of the rendezvous (issue 13 items 3 and 10): each test is an attack that worked before the fix."""

from __future__ import annotations

import hashlib

import pytest

from kafila.net import registration, stun, wire
from rendezvous.core import Limits, RendezvousCore
from rendezvous.limits import ip_key

pytestmark = pytest.mark.fast

A = ("100.64.0.2", 3478)
TOKEN = bytes(range(16))
TOKEN_HASH = hashlib.sha256(TOKEN).hexdigest()


def request(c: RendezvousCore, body: dict, src: tuple[str, int], now: float, rid: int = 1) -> tuple[int, dict | None]:
    """(request size, reply body or None when the rendezvous stayed silent)."""
    data = wire.encode_control(wire.REQUEST, rid, body)
    out = c.handle(data, src, A, now)
    assert len(out) <= 1
    if not out:
        return len(data), None
    frame = wire.decode(out[0][0])
    assert isinstance(frame, wire.Control) and frame.request_id == rid
    return len(data), frame.body


def create(c: RendezvousCore, src: tuple[str, int], now: float, rid: int = 1) -> dict | None:
    return request(c, {"op": "create", "token_hash": TOKEN_HASH}, src, now, rid)[1]


def test_one_ip_cannot_fill_the_session_table() -> None:
    c = RendezvousCore([A])  # default limits: 1000 sessions
    made = 0
    for i in range(1000):  # 1000 creates from 1000 source ports of one IP, at 50 per second
        r = create(c, ("198.51.100.7", 10000 + i), now=i * 0.02, rid=i)
        made += bool(r and r["ok"])
    assert made == Limits().max_sessions_per_ip
    r = create(c, ("203.0.113.9", 4000), now=20.0)  # someone else still gets a session
    assert r is not None and r["ok"] is True


def test_one_ipv6_prefix_counts_as_one_address() -> None:
    c = RendezvousCore([A], Limits(max_sessions_per_ip=3))
    results = [create(c, (f"2001:db8:1:2::{i:x}", 5000), now=float(i), rid=i) for i in range(1, 6)]
    assert [bool(r and r["ok"]) for r in results] == [True, True, True, False, False]
    assert results[3] is not None and results[3]["code"] == "full"
    r = create(c, ("2001:db8:1:3::1", 5000), now=9.0)  # the next /64 is someone else
    assert r is not None and r["ok"] is True
    assert ip_key("2001:db8:1:2::ff") == "2001:db8:1:2::/64" and ip_key("::ffff:10.1.2.3") == "10.1.2.3"


def test_sessions_only_their_creator_joined_expire_and_free_the_quota() -> None:
    c = RendezvousCore([A], Limits(max_sessions_per_ip=1, unjoined_session_ttl_s=100, member_timeout_s=1000))
    host, guest = ("198.51.100.7", 1), ("198.51.100.8", 2)
    r = create(c, host, now=0.0)
    assert r is not None and r["ok"]
    sid = r["session"]
    join = {"op": "join", "session": sid, "member": "aa" * 8, "token": TOKEN.hex()}
    assert request(c, join, host, 0.0, rid=2)[1]["ok"]  # type: ignore[index]
    assert create(c, host, now=1.0, rid=3)["code"] == "full"  # type: ignore[index]
    c.expire(99.0)
    assert sid in c.sessions  # the creator alone, within the TTL
    c.expire(101.0)
    assert sid not in c.sessions and not c.by_addr
    r = create(c, host, now=102.0, rid=4)
    assert r is not None and r["ok"]  # the quota came back with the session
    # a session someone else joined lives on
    sid2 = r["session"]
    for i, (src, mid) in enumerate([(host, "aa" * 8), (guest, "bb" * 8)]):
        body = {"op": "join", "session": sid2, "member": mid, "token": TOKEN.hex()}
        assert request(c, body, src, 102.0, rid=10 + i)[1]["ok"]  # type: ignore[index]
    c.expire(500.0)
    assert sid2 in c.sessions


def test_every_op_is_rate_limited_per_source() -> None:
    c = RendezvousCore([A], Limits(source_burst=5, source_rate=0.0))
    r = create(c, ("198.51.100.7", 1), now=0.0)
    assert r is not None
    src = ("198.51.100.7", 2)
    for op in ("list", "ping", "challenge", "announce", "leave", "nonsense"):
        codes = []
        for i in range(8):
            body = {"op": op, "session": r["session"], "member": "aa" * 8, "pad": "x" * 40}
            codes.append(request(c, body, src, now=0.0, rid=i)[1]["code"])  # type: ignore[index]
        assert codes[5:] == ["rate_limited"] * 3, (op, codes)
        src = (src[0], src[1] + 1)
    assert c.stats.rate_limited == 6 * 3


def test_stun_probes_are_rate_limited_per_source() -> None:
    c = RendezvousCore([A], Limits(source_burst=3, source_rate=0.0))
    req = stun.encode(stun.StunMessage(stun.BINDING_REQUEST, b"z" * 12))
    answered = [len(c.handle(req, ("198.51.100.7", 9), A, 0.0)) for _ in range(6)]
    assert answered == [1, 1, 1, 0, 0, 0]


def test_spraying_source_ports_does_not_refill_the_ip_bucket() -> None:
    # buckets are evicted least recently *used*: the sprayer's own IP bucket stays
    c = RendezvousCore([A], Limits(max_buckets=20, join_ip_burst=5, join_ip_rate=0.0))
    made = sum(bool((r := create(c, ("198.51.100.7", 2000 + i), now=0.0, rid=i)) and r["ok"]) for i in range(60))
    assert made == 5
    assert len(c.limiter) <= 20


def test_refusals_never_echo_the_request_nor_outgrow_it() -> None:
    c = RendezvousCore([A])
    sid = create(c, ("198.51.100.1", 1), now=0.0)["session"]  # type: ignore[index]
    marker = "Q" * 300
    attacks = [
        {"op": marker},  # before: the reply echoed the op, 2.9x the request
        {"op": "join", "session": marker[:8], "member": "aa" * 8, "token": TOKEN.hex()},
        {"op": "join", "session": sid, "member": "aa" * 8, "token": "00" * 16},
        {"op": "list", "session": sid, "member": "bb" * 8, "start": 0},
        {"op": "rejoin", "session": sid, "member": "bb" * 8, "nonce": "00" * 16, "mac": "00" * 32},
        {"op": "create", "token_hash": marker},
        {"op": "x"},  # too small for any refusal: silence
        {},
        {"op": None},
    ]
    sent = received = 0
    for i, body in enumerate(attacks):
        size, reply = request(c, body, ("203.0.113.66", 7), now=1.0, rid=100 + i)
        data = b"" if reply is None else wire.encode_control(wire.RESPONSE, 100 + i, reply)
        assert len(data) <= size, (body, reply)
        assert b"QQQQ" not in data
        assert reply is None or (reply["ok"] is False and isinstance(reply["code"], str))
        sent, received = sent + size, received + len(data)
    gain = received / sent
    assert gain <= 1.0, f"reflection gain {gain:.2f}"


def test_a_small_request_reusing_an_id_does_not_fetch_the_cached_reply() -> None:
    c = RendezvousCore([A])
    victim = ("203.0.113.66", 7)
    big = {"op": "join", "session": "zzzzzzzz", "member": "aa" * 8, "token": TOKEN.hex(), "pad": "P" * 900}
    _, reply = request(c, big, victim, now=0.0, rid=42)
    assert reply is not None and reply["code"] == "unknown_session"
    # before: every later datagram with id 42 from "victim" got that cached reply, whatever it asked
    for body in ({}, {"op": 1}, {"op": "x"}):
        small, again = request(c, body, victim, now=1.0, rid=42)
        assert again is None or len(wire.encode_control(wire.RESPONSE, 42, again)) <= small
    # a true retry (the same bytes) still gets the cached answer
    assert request(c, big, victim, now=2.0, rid=42)[1] == reply


def test_answers_a_spoofed_source_can_get_are_no_larger_than_their_requests() -> None:
    # what needs no registration at the source address: create, join, challenge, rejoin
    c = RendezvousCore([A])
    victim = ("203.0.113.66", 7)
    size, r = request(c, {"op": "create", "token_hash": TOKEN_HASH}, victim, 0.0, rid=1)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 1, r)) <= size
    sid = r["session"]
    size, r = request(c, registration.join_body(sid, b"m" * 8, TOKEN), victim, 0.0, rid=2)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 2, r)) <= size
    key = registration.reg_key_of(r)
    size, r = request(c, registration.challenge_body(sid, b"m" * 8), ("198.51.100.1", 9), 0.0, rid=3)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 3, r)) <= size
    body = registration.rejoin_body(sid, b"m" * 8, key, bytes.fromhex(r["nonce"]))
    size, r = request(c, body, ("198.51.100.1", 9), 0.0, rid=4)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 4, r)) <= size

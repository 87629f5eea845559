"""Abuse of the rendezvous (issue 13 items 3 and 10, issue 34 items 1 and 2): each test is an attack that worked
before the fix."""

from __future__ import annotations

import struct

import pytest

from kafila.net import registration, stun, wire
from rendezvous.core import Limits, RendezvousCore
from rendezvous.limits import ip_key, net_key
from tests.rendezvous.asking import OTHER_SECRET, answer, create_body, echoing_cookie, join_for

pytestmark = pytest.mark.fast

A = ("100.64.0.2", 3478)


def request(c: RendezvousCore, body: dict, src: tuple[str, int], now: float, rid: int = 1) -> tuple[int, dict | None]:
    """(request size, reply body or None when the rendezvous stayed silent), the cookie echoed where needed."""
    return echoing_cookie(c, body, src, A, now, rid)


def create(c: RendezvousCore, src: tuple[str, int], now: float, rid: int = 1) -> dict | None:
    return request(c, create_body(), src, now, rid)[1]


def test_one_network_cannot_fill_the_session_table() -> None:
    c = RendezvousCore([A])
    made = 0
    for i in range(1000):  # 1000 creates from 250 addresses of one /24, at 50 per second
        r = create(c, (f"198.51.100.{1 + i % 250}", 10000 + i), now=i * 0.02, rid=i)
        made += bool(r and r["ok"])
    assert made == Limits().max_sessions_per_net
    r = create(c, ("198.51.101.9", 4000), now=20.0)  # the next network still gets a session
    assert r is not None and r["ok"] is True


def test_one_ipv6_prefix_counts_as_one_network() -> None:
    c = RendezvousCore([A], Limits(max_sessions_per_net=3))
    results = [create(c, (f"2001:db8:1:{i:x}::1", 5000), now=float(i), rid=i) for i in range(1, 6)]
    assert [bool(r and r["ok"]) for r in results] == [True, True, True, False, False]
    assert results[3] is not None and results[3]["code"] == "full"
    r = create(c, ("2001:db8:2::1", 5000), now=9.0)  # the next /48 is someone else
    assert r is not None and r["ok"] is True
    assert ip_key("2001:db8:1:2::ff") == "2001:db8:1:2::/64" and ip_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert net_key("2001:db8:1:2::ff") == "2001:db8:1::/48" and net_key("::ffff:10.1.2.3") == "10.1.2.0/24"


def test_sessions_no_second_address_joined_expire_and_free_the_quota() -> None:
    c = RendezvousCore([A], Limits(max_sessions_per_net=1, unjoined_session_ttl_s=100, member_timeout_s=1000))
    host, guest = ("198.51.100.7", 1), ("198.51.100.8", 2)
    r = create(c, host, now=0.0)
    assert r is not None and r["ok"]
    sid = r["session"]
    # before: a second member id joined from the creator's own address kept the session for good
    for i, mid in enumerate(("aa" * 8, "cc" * 8)):
        join = join_for(sid, bytes.fromhex(mid))
        assert request(c, join, host, 0.0, rid=2 + i)[1]["ok"]  # type: ignore[index]
    assert create(c, host, now=1.0, rid=5)["code"] == "full"  # type: ignore[index]
    c.expire(99.0)
    assert sid in c.sessions  # the creator alone, within the TTL
    c.expire(101.0)
    assert sid not in c.sessions and not c.by_addr
    r = create(c, host, now=102.0, rid=6)
    assert r is not None and r["ok"]  # the quota came back with the session
    # a session someone else joined lives on
    sid2 = r["session"]
    for i, (src, mid) in enumerate([(host, "aa" * 8), (guest, "bb" * 8)]):
        body = join_for(sid2, bytes.fromhex(mid))
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
        join_for(marker[:8], b"\xaa" * 8),
        join_for(sid, b"\xaa" * 8, OTHER_SECRET),
        {"op": "list", "session": sid, "member": "bb" * 8, "start": 0},
        {"op": "rejoin", "session": sid, "member": "bb" * 8, "nonce": "00" * 16, "mac": "00" * 32},
        {"op": "create", "join_pub": marker},
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
    cookie = c.cookies.issue(victim, 0.0)
    big = {**join_for("zzzzzzzz", b"\xaa" * 8)(cookie), "cookie": cookie.hex(), "pad": "P" * 900}
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
    size, r = request(c, create_body(), victim, 0.0, rid=1)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 1, r)) <= size
    sid = r["session"]
    size, r = request(c, join_for(sid, b"m" * 8), victim, 0.0, rid=2)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 2, r)) <= size
    key = registration.reg_key_of(r)
    size, r = request(c, registration.challenge_body(sid, b"m" * 8), ("198.51.100.1", 9), 0.0, rid=3)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 3, r)) <= size
    body = registration.rejoin_body(sid, b"m" * 8, key, bytes.fromhex(r["nonce"]))
    size, r = request(c, body, ("198.51.100.1", 9), 0.0, rid=4)
    assert r is not None and r["ok"] and len(wire.encode_control(wire.RESPONSE, 4, r)) <= size


def test_a_source_that_never_reads_its_replies_places_nothing() -> None:
    # issue 34 items 1 and 2: blind creates and joins from spoofed sources filled the table and registered
    # victims' addresses, at which `list` answers (17.6x) and relayed traffic were then aimed
    c = RendezvousCore([A], Limits(member_timeout_s=1e4, unjoined_session_ttl_s=1e4))  # the host's stays
    host, mine = ("198.51.100.1", 1), ("203.0.113.5", 7)
    sid = create(c, host, now=0.0)["session"]  # type: ignore[index]
    assert request(c, join_for(sid, b"h" * 8), host, 0.0, rid=2)[1]["ok"]  # type: ignore[index]
    sent = received = 0
    for t in range(0, 1500, 10):  # 25 minutes of blind creates and joins from 16 spoofed sources
        for i in range(16):
            victim = (f"192.0.2.{i}", 4000 + i)
            forged = {"cookie": "00" * 16}
            also = c.cookies.issue(mine, float(t)).hex()  # a cookie the attacker did read, for its own address
            for body in (create_body(), {**create_body(), **forged},
                         {**join_for(sid, bytes([i]) * 8)(b"\0" * 16), **forged},
                         {**join_for(sid, bytes([i]) * 8)(bytes.fromhex(also)), "cookie": also}):
                size, reply = answer(c, body, victim, A, float(t), rid=t + i)
                assert reply is not None and reply["code"] == "cookie", reply
                n = len(wire.encode_control(wire.RESPONSE, t + i, reply))
                assert n <= size
                sent, received = sent + size, received + n
            ping = {"op": "ping", "session": sid, "member": (bytes([i]) * 8).hex()}
            assert answer(c, ping, victim, A, float(t), rid=t + i)[1]["code"] == "not_member"  # type: ignore[index]
    assert list(c.sessions) == [sid] and set(c.by_addr) == {host}  # nothing placed for a victim
    assert received / sent < 0.7
    r = create(c, ("198.51.100.9", 2), now=1500.0)  # a real host's create: not "full"
    assert r is not None and r["ok"]


def test_a_cookie_is_bound_to_its_address_and_lasts_30_to_60_s() -> None:
    c = RendezvousCore([A])
    src = ("198.51.100.7", 5000)
    cookie = c.cookies.issue(src, 0.0)
    assert c.cookies.valid(cookie, src, 59.0) and not c.cookies.valid(cookie, src, 61.0)
    assert not c.cookies.valid(cookie, ("198.51.100.7", 5001), 1.0)
    assert not c.cookies.valid(cookie, ("198.51.100.8", 5000), 1.0)
    body = {**create_body(), "cookie": cookie.hex()}
    assert answer(c, body, src, A, 61.0, rid=1)[1]["code"] == "cookie"  # type: ignore[index]
    assert answer(c, body, src, A, 30.0, rid=2)[1]["ok"] is True  # type: ignore[index]
    # the cookie request itself must be padded: its answer is never the larger
    assert answer(c, {"op": "cookie"}, src, A, 31.0, rid=3)[1] is None
    size, r = answer(c, registration.cookie_body(), src, A, 31.0, rid=4)
    assert r is not None and c.cookies.valid(bytes.fromhex(r["cookie"]), src, 31.0)
    assert len(wire.encode_control(wire.RESPONSE, 4, r)) <= size


def test_stun_answers_only_requests_padded_to_their_size() -> None:
    # issue 34 item 2: a 20-byte Binding request drew a 56-byte answer at any spoofed source
    c = RendezvousCore([A, ("100.64.0.2", 3479), ("100.64.0.3", 3478), ("100.64.0.3", 3479)])
    bare = struct.pack("!HHI", stun.BINDING_REQUEST, 0, stun.MAGIC) + b"t" * 12
    assert c.handle(bare, ("2001:db8::1", 9), A, 0.0) == []
    padded = stun.encode(stun.StunMessage(stun.BINDING_REQUEST, b"t" * 12))
    for src in (("2001:db8::1", 9), ("198.51.100.7", 9)):
        [(reply, _, dst)] = c.handle(padded, src, A, 0.0)
        assert dst == src and len(reply) <= len(padded) and stun.decode(reply).mapped == src

"""Member registration at the rendezvous (issue 13 item 6, issue 34 item 9): a signed first join, then MAC'd
re-joins."""

from __future__ import annotations

import pytest

from kafila.net import registration
from rendezvous.core import Limits, RendezvousCore
from tests.rendezvous.asking import create_body, echoing_cookie, join_for

pytestmark = pytest.mark.fast

A = ("100.64.0.2", 3478)
MID = b"m" * 8
HOME, MOVED, EVE = ("10.0.0.1", 1000), ("10.0.0.1", 1001), ("6.6.6.6", 666)


def ask(c: RendezvousCore, body: dict, src: tuple[str, int], now: float = 0.0, rid: int = 1) -> dict:
    _, reply = echoing_cookie(c, body, src, A, now, rid)
    assert reply is not None
    return reply


def registered() -> tuple[RendezvousCore, str, bytes]:
    """A core with one session and member MID joined from HOME; its registration key."""
    c = RendezvousCore([A], Limits(member_timeout_s=300))  # members stay while nonces age
    sid = ask(c, create_body(), HOME, rid=99)["session"]
    r = ask(c, join_for(sid, MID), HOME, rid=98)
    assert r["ok"] is True and r["members"] == 1
    return c, sid, registration.reg_key_of(r)


def challenge(c: RendezvousCore, sid: str, src: tuple[str, int], now: float = 0.0, rid: int = 2) -> bytes:
    r = ask(c, registration.challenge_body(sid, MID), src, now, rid)
    assert r["ok"] is True, r
    return bytes.fromhex(r["nonce"])


def test_whoever_knows_the_code_cannot_take_over_a_member() -> None:
    c, sid, _ = registered()
    # before: this re-registered MID at Eve's address, and relayed traffic for MID went to her
    r = ask(c, join_for(sid, MID), EVE, rid=3)
    assert r["ok"] is False and r["code"] == "member_exists"
    assert c.sessions[sid].members[MID].addr == HOME and EVE not in c.by_addr


def test_rejoin_with_the_key_moves_the_relay_address() -> None:
    c, sid, key = registered()
    nonce = challenge(c, sid, MOVED, now=1.0)  # the NAT rebound: challenge and re-join from the new address
    r = ask(c, registration.rejoin_body(sid, MID, key, nonce), MOVED, now=1.5, rid=3)
    assert r == {"ok": True, "members": 1}
    assert c.sessions[sid].members[MID].addr == MOVED and c.by_addr[MOVED] == (sid, MID) and HOME not in c.by_addr
    assert c.stats.rejoins == 1


def test_rejoin_without_the_key_or_with_a_spent_nonce_is_refused() -> None:
    c, sid, key = registered()
    nonce = challenge(c, sid, EVE)
    r = ask(c, registration.rejoin_body(sid, MID, b"\0" * 32, nonce), EVE, rid=3)
    assert r["code"] == "bad_mac"
    r = ask(c, registration.rejoin_body(sid, MID, key, nonce), EVE, rid=4)  # spent by the wrong MAC
    assert r["code"] == "stale_nonce"
    # a rejoin seen on the wire, replayed from elsewhere, is spent too
    nonce = challenge(c, sid, HOME, rid=5)
    seen = registration.rejoin_body(sid, MID, key, nonce)
    assert ask(c, seen, HOME, rid=6)["ok"] is True
    assert ask(c, seen, EVE, rid=7)["code"] == "stale_nonce"
    assert c.sessions[sid].members[MID].addr == HOME


def test_a_nonce_counts_for_30_s_from_the_address_it_was_issued_to() -> None:
    # a later challenge no longer spoils an earlier one (issue 56 item 5): each nonce stands alone
    c, sid, key = registered()
    old = challenge(c, sid, HOME, now=0.0, rid=2)
    new = challenge(c, sid, HOME, now=1.0, rid=3)
    assert ask(c, registration.rejoin_body(sid, MID, key, old), MOVED, now=1.0, rid=4)["code"] == "stale_nonce"
    assert ask(c, registration.rejoin_body(sid, MID, key, old), HOME, now=1.0, rid=5)["ok"] is True
    late = 1.0 + registration.NONCE_TTL_S + 0.1
    assert ask(c, registration.rejoin_body(sid, MID, key, new), HOME, now=late, rid=6)["code"] == "stale_nonce"
    fresh = challenge(c, sid, HOME, now=late, rid=7)
    assert ask(c, registration.rejoin_body(sid, MID, key, fresh), HOME, now=late, rid=8)["ok"] is True
    assert ask(c, registration.rejoin_body(sid, MID, key, fresh), HOME, now=late, rid=9)["code"] == "stale_nonce"


def test_a_spoofed_challenge_does_not_block_a_members_rejoin() -> None:
    """Issue 56 item 5: one challenge for the member from elsewhere, between its own challenge and its re-join,
    replaced its nonce, so 15 of 15 re-joins failed; now each re-join succeeds."""
    c, sid, key = registered()
    rejoined = 0
    for i in range(15):
        now, where = 2.0 * i, (HOME[0], 2000 + i)  # a NAT that rebinds now and then
        nonce = challenge(c, sid, where, now=now, rid=10 * i + 1)
        spoofed = ask(c, registration.challenge_body(sid, MID), (f"6.6.6.{i}", 666), now, rid=10 * i + 2)
        assert spoofed["ok"] is True
        r = ask(c, registration.rejoin_body(sid, MID, key, nonce), where, now=now + 0.5, rid=10 * i + 3)
        rejoined += r.get("ok") is True and c.sessions[sid].members[MID].addr == where
    assert rejoined == 15


def test_a_strangers_wrong_macs_keep_little_and_block_nothing() -> None:
    c, sid, key = registered()
    for i in range(50):  # strangers spend nonces issued to their own addresses
        eve = (f"6.6.{i}.6", 666)
        nonce = challenge(c, sid, eve, now=0.0, rid=100 + 2 * i)
        r = ask(c, registration.rejoin_body(sid, MID, b"\0" * 32, nonce), eve, rid=101 + 2 * i)
        assert r["code"] == "bad_mac"
    m = c.sessions[sid].members[MID]
    assert len(m.spent) <= 8 and m.addr == HOME
    nonce = challenge(c, sid, MOVED, now=1.0, rid=3)
    assert ask(c, registration.rejoin_body(sid, MID, key, nonce), MOVED, now=1.0, rid=4)["ok"] is True


def test_a_rejoin_answered_once_is_answered_again_to_its_retry() -> None:
    c, sid, key = registered()
    nonce = challenge(c, sid, MOVED)
    body = registration.rejoin_body(sid, MID, key, nonce)
    first = ask(c, body, MOVED, rid=8)
    assert first["ok"] is True and ask(c, body, MOVED, now=0.5, rid=8) == first  # the reply was lost: same answer


def test_a_seen_join_cannot_be_used_again() -> None:
    # issue 34 item 9: the first join carried the join token in clear; whoever saw it could fill the session
    c, sid, _ = registered()
    cookie = c.cookies.issue(EVE, 0.0)
    seen = {**join_for(sid, b"e" * 8)(c.cookies.issue(HOME, 0.0)), "cookie": c.cookies.issue(HOME, 0.0).hex()}
    assert ask(c, seen, EVE, rid=3)["code"] == "cookie"  # sent from elsewhere: that cookie is not Eve's
    r = ask(c, {**seen, "cookie": cookie.hex()}, EVE, rid=4)  # with Eve's own cookie: the proof is not for it
    assert r["code"] == "wrong_code" and b"e" * 8 not in c.sessions[sid].members
    again = {**join_for(sid, b"f" * 8)(cookie), "cookie": cookie.hex()}
    r = ask(c, {**again, "member": (b"g" * 8).hex()}, EVE, rid=5)  # another member id under a seen proof
    assert r["code"] == "wrong_code" and len(c.sessions[sid].members) == 1


def test_another_members_key_does_not_open_this_member() -> None:
    c, sid, _ = registered()
    other = registration.reg_key_of(ask(c, join_for(sid, b"o" * 8), EVE, rid=3))
    nonce = challenge(c, sid, EVE, rid=4)
    r = ask(c, registration.rejoin_body(sid, MID, other, nonce), EVE, rid=5)
    assert r["code"] == "bad_mac" and c.sessions[sid].members[MID].addr == HOME


def test_challenge_and_rejoin_for_strangers_are_refused_with_codes() -> None:
    c, sid, key = registered()
    assert ask(c, registration.challenge_body(sid, b"x" * 8), EVE)["code"] == "not_member"
    assert ask(c, registration.challenge_body("zzzzzzzz", MID), EVE, rid=2)["code"] == "unknown_session"
    r = ask(c, registration.rejoin_body(sid, MID, key, b"\1" * 16), EVE, rid=3)  # no challenge issued
    assert r["code"] == "stale_nonce"


def test_a_members_ops_from_its_address_need_its_key_and_a_fresh_counter() -> None:
    # issue 34 item 3: from the member's public ip:port (a spoofer, or someone behind the same NAT) a garbage
    # announce replaced its announcement for good, and a spoofed leave dropped it
    c, sid, key = registered()
    mid = MID.hex()
    good = registration.signed({"op": "announce", "session": sid, "member": mid, "ann": "QUFB"}, key, 5)
    assert ask(c, good, HOME, rid=10)["ok"] is True
    m = c.sessions[sid].members[MID]
    forged = [
        {"op": "announce", "session": sid, "member": mid, "ann": "R0FSQkFHRQ=="},  # as before: no MAC
        registration.signed({"op": "announce", "session": sid, "member": mid, "ann": "R0FSQkFHRQ=="}, b"\0" * 32, 6),
        {**good, "ann": "R0FSQkFHRQ=="},  # a seen op, its text changed
        good,  # a seen op again (another request id): its counter is spent
        registration.signed({"op": "leave", "session": sid, "member": mid}, b"\1" * 32, 7),
    ]
    for i, body in enumerate(forged):
        r = ask(c, body, HOME, rid=20 + i)
        assert r["ok"] is False and r["code"] in ("bad_mac", "bad_request"), (body, r)
    assert m.announcement == "QUFB" and MID in c.sessions[sid].members
    # even with its key, from another address than the member's: refused (re-join moves the address)
    moved = registration.signed({"op": "announce", "session": sid, "member": mid, "ann": "R0FSQkFHRQ=="}, key, 8)
    assert ask(c, moved, EVE, rid=29)["code"] == "not_member" and m.announcement == "QUFB"
    # the member's own ops, crossing on the way (a counter below the highest, unused) are taken once each
    late = registration.signed({"op": "list", "session": sid, "member": mid, "start": 0}, key, 3)
    assert ask(c, registration.signed({"op": "ping", "session": sid, "member": mid}, key, 9), HOME, rid=30)["ok"]
    assert ask(c, late, HOME, rid=31)["ok"] is True
    assert ask(c, late, HOME, rid=32)["code"] == "bad_mac"
    assert ask(c, registration.signed({"op": "leave", "session": sid, "member": mid}, key, 10), HOME, rid=33)["ok"]
    assert MID not in c.sessions[sid].members

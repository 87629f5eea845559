"""kafila.net.registration: the re-join MAC, request bodies, and refusal codes mapped to exception types."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafila.errors import (
    RENDEZVOUS_CODES,
    MemberExists,
    NotMember,
    RejoinRefused,
    RendezvousBusy,
    RendezvousError,
    SessionError,
    UnknownSession,
    WrongJoinCode,
)
from kafila.net import registration
from rendezvous.core import RendezvousCore
from tests.rendezvous.asking import create_body, echoing_cookie, join_for

pytestmark = pytest.mark.fast

A = ("100.64.0.2", 3478)


def test_mac_is_hmac_sha256_over_the_documented_layout() -> None:
    key, nonce = bytes(range(32)), bytes(range(16))
    want = hmac.new(key, b"kafila-rejoin\x00" + b"k7q2m9xd" + b"m" * 8 + nonce, hashlib.sha256).digest()
    assert registration.rejoin_mac(key, "k7q2m9xd", b"m" * 8, nonce) == want
    assert registration.mac_ok(key, "k7q2m9xd", b"m" * 8, nonce, want)
    assert not registration.mac_ok(key, "k7q2m9xe", b"m" * 8, nonce, want)
    assert not registration.mac_ok(key, "k7q2m9xd", b"m" * 8, nonce[::-1], want)
    body = registration.rejoin_body("k7q2m9xd", b"m" * 8, key, nonce)
    assert body == {"op": "rejoin", "session": "k7q2m9xd", "member": (b"m" * 8).hex(), "nonce": nonce.hex(),
                    "mac": want.hex()}


@pytest.mark.parametrize(("code", "cls"), [
    ("wrong_code", WrongJoinCode), ("unknown_session", UnknownSession), ("not_member", NotMember),
    ("member_exists", MemberExists), ("rate_limited", RendezvousBusy), ("full", RendezvousBusy),
    ("stale_nonce", RejoinRefused), ("bad_mac", RejoinRefused), ("bad_request", RendezvousError),
])
def test_each_code_has_its_type_and_a_message_without_the_servers_text(code: str, cls: type) -> None:
    exc = registration.refusal("join", {"ok": False, "code": code})
    assert type(exc) is cls and isinstance(exc, SessionError) and exc.code == code
    assert str(exc) == f"rendezvous refused 'join': {registration.MESSAGES[code]}"
    exc = registration.refusal("join", {"ok": False, "code": code, "error": "session is full (16 members)"})
    assert str(exc).endswith("session is full (16 members)")


def test_unknown_codes_and_unprintable_texts_are_not_trusted() -> None:
    exc = registration.refusal("list", {"ok": False, "code": "\x1b[2J", "error": "x\x1b[2Jy"})
    assert type(exc) is RendezvousError and exc.code == "refused" and "\x1b" not in str(exc)
    exc = registration.refusal("list", {"ok": False, "error": "z" * 5000})
    assert len(str(exc)) < 100


@given(st.dictionaries(st.sampled_from(["ok", "code", "error"]),
                       st.one_of(st.text(max_size=300), st.integers(), st.none(), st.booleans(),
                                 st.sampled_from(list(RENDEZVOUS_CODES)))))
def test_fuzz_refusal_always_gives_a_short_rendezvous_error(reply: dict) -> None:
    exc = registration.refusal("x", reply)
    assert isinstance(exc, RendezvousError) and len(str(exc)) <= 240 and str(exc).isprintable()


def test_rejoin_against_an_in_memory_rendezvous() -> None:
    c = RendezvousCore([A])
    src = ["10.0.0.1", 1000]
    now = [0.0]
    rid = [0]

    async def request(body: Any) -> dict[str, Any]:
        rid[0] += 1
        _, reply = echoing_cookie(c, body, (src[0], int(src[1])), A, now[0], rid[0])
        assert reply is not None
        if reply.get("ok") is not True:
            raise registration.refusal("request", reply)
        return reply

    async def scenario() -> None:
        sid = (await request(create_body()))["session"]
        key = registration.reg_key_of(await request(join_for(sid, b"m" * 8)))
        with pytest.raises(MemberExists):
            await request(join_for(sid, b"m" * 8))
        src[1] = 2000  # the NAT rebound
        now[0] = 5.0
        assert await registration.rejoin(request, sid, b"m" * 8, key) == 1
        assert c.sessions[sid].members[b"m" * 8].addr == ("10.0.0.1", 2000)
        with pytest.raises(RejoinRefused):
            await registration.rejoin(request, sid, b"m" * 8, b"\0" * 32)
        with pytest.raises(UnknownSession):
            await registration.rejoin(request, "zzzzzzzz", b"m" * 8, key)

    asyncio.run(scenario())

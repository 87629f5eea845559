"""Join codes and sealed announcements: only members can make or read one, and an old one is refused."""

from __future__ import annotations

import base64
import json
import re
import secrets
import zlib

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError, SessionError
from kafila.net import trust
from kafila.net.quic import Identity
from kafila.net.trust import MAX_ANNOUNCEMENT_AGE_S, Announcement, JoinCode, now_wall, open_announcement

pytestmark = pytest.mark.fast

T0 = 1_764_500_000.0  # a fixed "now" for the tests of age


def ann(code: JoinCode, mid: bytes = b"m" * 8, fp: bytes = b"f" * 32, name: str = "alice",
        t: float | None = None) -> Announcement:
    return Announcement(code.session_id, mid, name, fp, "ordinary", ("100.64.0.11", 4000),
                        ("10.1.0.2", 4000), 1.5, {"bw": 1e9, "gpu": "RTX 4090"}, now_wall() if t is None else t,
                        b"p" * 32)


def test_code_round_trip_and_forgiving_parse() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    assert JoinCode.parse(str(code)) == code
    assert JoinCode.parse("  " + str(code).upper().replace("-", " ") + " ") == code
    assert JoinCode.parse("k7q2m9xd-4f8t-zr2w-9mhc-qp3a").secret == "4f8tzr2w9mhcqp3a"
    assert JoinCode.parse("K7Q2M9XD-4F8T-ZR2W-9MHC-QP3O").secret.endswith("0")  # O read as zero
    assert len(code.secret) * 5 >= 80
    with pytest.raises(SessionError, match="malformed"):
        JoinCode.parse("k7q2m9xd-4f8t")


def test_keys_are_independent_of_each_other() -> None:
    code = JoinCode("k7q2m9xd", "4f8tzr2w9mhcqp3a")
    assert len({code.join_public[:16], code.announce_key[:16], code.punch_key[:16]}) == 3
    other = JoinCode("k7q2m9xd", "4f8tzr2w9mhcqp3b")
    assert other.announce_key != code.announce_key



def test_a_pairs_punch_key_is_the_same_from_both_ends_and_no_one_elses() -> None:
    """Alice and bob derive one key; mallory, holding the code and her own key pair, derives another with each of
    them and cannot derive theirs (issue #56 item 1); another session's salt gives another key."""
    code = JoinCode("k7q2m9xd", "4f8tzr2w9mhcqp3a")
    ids = {n: n.encode().ljust(8, b"-") for n in ("alice", "bob", "mallory")}
    keys = {n: Identity(n) for n in ids}

    def pair(me: str, peer: str, salt: bytes = code.punch_key) -> bytes:
        return trust.pair_punch_key(salt, ids[me], keys[me].punch_private, ids[peer], keys[peer].punch_public)

    assert pair("alice", "bob") == pair("bob", "alice")
    assert len({pair("alice", "bob"), pair("mallory", "bob"), pair("mallory", "alice"), code.punch_key}) == 4
    assert pair("alice", "bob", JoinCode("k7q2m9xd", "4f8tzr2w9mhcqp3b").punch_key) != pair("alice", "bob")
    for bad in (b"", b"\x01" * 31, bytes(32)):  # malformed, and a low-order point (an all-zero shared secret)
        with pytest.raises(ValueError):
            trust.pair_punch_key(code.punch_key, ids["alice"], keys["alice"].punch_private, ids["bob"], bad)


def test_verified_announcement() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    vm = open_announcement(ann(code, t=T0).seal(code), code, b"m" * 8, ("1.2.3.4", 5), now=T0 + 1)
    assert vm.fingerprint == b"f" * 32 and vm.nat_class.value == "ordinary" and vm.observed == ("1.2.3.4", 5)
    assert vm.name == "alice" and vm.local == ("10.1.0.2", 4000) and vm.issued_at == T0
    assert vm.measurements == {"bw": 1e9, "gpu": "RTX 4090"}


def test_the_rendezvous_reads_nothing_but_ciphertext() -> None:
    """What the rendezvous stores and lists holds none of the announcement's contents, and hides its size."""
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    a = ann(code, fp=bytes.fromhex("ab" * 32))
    sealed = a.seal(code)
    blob = base64.b64decode(sealed)
    # (markers of 5 bytes or more: a shorter one could turn up in random bytes by chance)
    for secret_part in (b"alice", b"ab" * 32, bytes.fromhex("ab" * 32), b"10.1.0.2", b"100.64.0.11", b"RTX 4090",
                        b"ordinary", code.session_id.encode(), (b"m" * 8).hex().encode()):
        assert secret_part not in blob
    # names of different lengths give sealed announcements of one size: padded to 128 bytes
    assert {len(ann(code, name="a" * n).seal(code)) for n in range(1, 25)} == {len(sealed)}
    assert len(sealed) <= 1300  # what the rendezvous accepts for one announcement
    assert a.seal(code) != sealed  # a fresh nonce each time: equal announcements do not look equal


def test_wrong_secret_tampering_and_replays_are_refused() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    outsider = JoinCode("k7q2m9xd", JoinCode.new_secret())
    with pytest.raises(SessionError, match="MAC"):
        open_announcement(ann(outsider).seal(outsider), code, b"m" * 8)
    blob = bytearray(base64.b64decode(ann(code).seal(code)))
    for i in (1, 20, len(blob) - 1):  # the nonce, the ciphertext, the tag: a rendezvous altering it blindly
        bad = bytearray(blob)
        bad[i] ^= 0x01
        with pytest.raises(SessionError, match="MAC"):
            open_announcement(base64.b64encode(bad).decode(), code, b"m" * 8)
    with pytest.raises(SessionError, match="announcement of"):
        open_announcement(ann(code).seal(code), code, b"x" * 8)  # listed under another member's id
    same_secret_other_session = JoinCode("abcdefgh", code.secret)
    with pytest.raises(SessionError, match="MAC"):
        open_announcement(ann(same_secret_other_session).seal(same_secret_other_session), code, b"m" * 8)


def test_an_announcement_older_than_a_session_can_live_is_refused() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    day_old = ann(code, t=T0 - 24 * 3600).seal(code)
    assert open_announcement(day_old, code, b"m" * 8, now=T0).issued_at == T0 - 24 * 3600
    stale = ann(code, t=T0 - MAX_ANNOUNCEMENT_AGE_S - 1).seal(code)
    with pytest.raises(SessionError, match="26 h old"):
        open_announcement(stale, code, b"m" * 8, now=T0 + 3600)


def test_an_older_announcement_does_not_replace_a_newer_one() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    first = ann(code, t=T0, fp=b"1" * 32).seal(code)
    second = ann(code, t=T0 + 60, fp=b"2" * 32).seal(code)  # the member restarted with a new certificate
    seen = open_announcement(second, code, b"m" * 8, now=T0 + 61)
    assert open_announcement(second, code, b"m" * 8, previous=seen, now=T0 + 90).fingerprint == b"2" * 32  # again
    with pytest.raises(SessionError, match="older than one already seen from it"):
        open_announcement(first, code, b"m" * 8, previous=seen, now=T0 + 90)
    other = open_announcement(ann(code, mid=b"o" * 8, t=T0 + 3000).seal(code), code, b"o" * 8, now=T0 + 3000)
    assert open_announcement(first, code, b"m" * 8, previous=other, now=T0 + 90).fingerprint == b"1" * 32


def test_an_announcement_of_the_old_format_is_named() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    v1 = base64.b64encode(b'{"v":1}' + b"\0" * 32).decode()  # version 1: JSON in clear plus an HMAC
    with pytest.raises(ProtocolError, match=f"version 123, not {trust.ANNOUNCE_VERSION}"):
        open_announcement(v1, code, b"m" * 8)


def seal_raw(code: JoinCode, body: bytes, deflate: bool = True) -> str:
    """Seal arbitrary bytes (deflated, as a member's are, or not) as a member would (it knows the secret): what
    the parser must survive."""
    nonce = secrets.token_bytes(12)
    return base64.b64encode(bytes([trust.ANNOUNCE_VERSION]) + nonce + ChaCha20Poly1305(code.announce_key).encrypt(
        nonce, zlib.compress(body) if deflate else body, trust._aad(code))).decode()


def test_a_members_malformed_body_is_a_protocol_error() -> None:
    code = JoinCode("k7q2m9xd", "0123456789abcdef")
    body = json.loads(ann(code).body())
    for change in ({"t": "NaN"}, {"t": None}, {"fp": "ab"}, {"nat": "weird"}, {"v": 1}, {"pk": "cd" * 31}):
        with pytest.raises(ProtocolError, match=r"malformed|fingerprint|punch key"):
            open_announcement(seal_raw(code, json.dumps({**body, **change}).encode()), code, b"m" * 8)
    with pytest.raises(ProtocolError, match="malformed"):
        open_announcement(seal_raw(code, b"[1, 2]"), code, b"m" * 8)  # was an AttributeError


# each field of an announcement's body: values a member's own code writes, and values it never would
VALID = {
    "v": st.just(trust.ANNOUNCE_VERSION), "session": st.just("k7q2m9xd"), "member": st.just((b"m" * 8).hex()),
    "name": st.text(max_size=8) | st.text(min_size=60, max_size=80),
    "fp": st.sampled_from(["ab" * 32, "00" * 32]), "pk": st.sampled_from(["cd" * 32]),
    "nat": st.sampled_from(["permissive", "ordinary", "restrictive"]),
    "mapped": st.none() | st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)).map(list),
    "local": st.none() | st.just(["10.0.0.1", 4]), "rtt_ms": st.none() | st.floats(0, 1e4),
    "m": st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    "t": st.floats(T0 - MAX_ANNOUNCEMENT_AGE_S + 1, T0 + 3600),
}
FUZZED = {
    "v": st.sampled_from([1, "2", 2.5, None]), "session": st.sampled_from(["abcdefgh", "x", 8]),
    "member": st.text(max_size=20) | st.sampled_from([(b"x" * 8).hex(), (b"m" * 9).hex()]),
    "name": st.integers() | st.none(), "fp": st.sampled_from(["zz", "", "ab" * 31, "ab" * 33]),
    "pk": st.sampled_from(["zz", "", "cd" * 31, "cd" * 33]) | st.none(),
    "nat": st.text(max_size=10),
    "mapped": st.lists(st.integers() | st.text(max_size=8), max_size=3) | st.just(["x", 70000]),
    "local": st.integers() | st.just(["10.0.0.1"]), "rtt_ms": st.sampled_from(["x", "", []]),
    "m": st.integers() | st.text(max_size=3),
    "t": st.floats() | st.text(max_size=4) | st.none() | st.just(T0 - 26 * 3600),
}


@st.composite
def bodies(draw: st.DrawFn) -> tuple[dict[str, object], bool]:
    """An announcement body of what a member writes but for a field or two, fuzzed or absent (or none), and
    whether it is all a member's own code writes."""
    disturbed = draw(st.lists(st.sampled_from(list(VALID)), max_size=2))
    body: dict[str, object] = {}
    for key, valid in VALID.items():
        if key not in disturbed:
            body[key] = draw(valid)
        elif draw(st.integers(0, 3)):
            body[key] = draw(FUZZED[key])
    return body, not disturbed


@settings(max_examples=300, deadline=None)
@given(st.one_of(bodies(), st.binary(max_size=200).map(lambda b: (b, False))), st.booleans())
def test_fuzz_sealed_bodies_from_a_member(case: tuple[dict[str, object] | bytes, bool], deflate: bool) -> None:
    """Any body sealed with the right key is an announcement or a ProtocolError/SessionError, nothing else; one a
    member's code writes is accepted; and what is accepted says what the body says, within the documented bounds."""
    code = JoinCode("k7q2m9xd", "0123456789abcdef")
    body, genuine = case
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        vm = open_announcement(seal_raw(code, raw, deflate), code, (b"m" * 8), now=T0)
    except (ProtocolError, SessionError):
        assert not (genuine and deflate), body
        return
    assert deflate and isinstance(body, dict)
    assert (body["v"], body["session"], body["member"]) == (trust.ANNOUNCE_VERSION, "k7q2m9xd", "6d" * 8)
    assert vm.member_id == b"m" * 8 and vm.fingerprint == bytes.fromhex(str(body["fp"])) and len(vm.fingerprint) == 32
    assert vm.punch_public == bytes.fromhex(str(body["pk"])) and len(vm.punch_public) == 32
    assert vm.name == str(body["name"])[:64]  # a name is cut to 64 characters
    assert vm.nat_class.value == body["nat"] and vm.rtt_ms == body["rtt_ms"]
    assert vm.measurements == (body["m"] if isinstance(body["m"], dict) else {})  # "" is read as no measurements
    for got, sent in ((vm.mapped, body["mapped"]), (vm.local, body["local"])):
        assert got == (tuple(sent) if sent is not None else None)  # type: ignore[arg-type]
        assert got is None or (isinstance(got[0], str) and len(got[0]) <= 64 and 0 <= got[1] <= 65535)
    assert vm.issued_at == body["t"] and T0 - vm.issued_at <= MAX_ANNOUNCEMENT_AGE_S


@settings(max_examples=150, deadline=None)
@given(name=st.text(max_size=64),
       measurements=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=20), max_size=8),
       t=st.floats(T0 - 24 * 3600, T0 + 3600))
def test_round_trip_of_any_announcement_that_fits(name: str, measurements: dict[str, object], t: float) -> None:
    code = JoinCode("k7q2m9xd", "0123456789abcdef")
    a = Announcement(code.session_id, b"m" * 8, name, b"f" * 32, "ordinary", None, ("10.0.0.1", 4), None,
                     measurements, t, b"p" * 32)
    try:
        sealed = a.seal(code)
    except SessionError as exc:  # too big for one datagram: refused when made, never sent
        size = re.search(r"announcement is (\d+) bytes", str(exc))
        assert size is not None and int(size.group(1)) > trust.MAX_ANNOUNCEMENT
        return
    vm = open_announcement(sealed, code, b"m" * 8, now=T0)
    assert (vm.name, vm.measurements, vm.local) == (name, measurements, ("10.0.0.1", 4))
    assert vm.issued_at == round(t, 3) and len(sealed) <= 1300

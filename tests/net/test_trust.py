"""Join codes and sealed announcements: only members can make or read one, and an old one is refused."""

from __future__ import annotations

import base64
import json
import re
import secrets

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError, SessionError
from kafila.net import trust
from kafila.net.trust import MAX_ANNOUNCEMENT_AGE_S, Announcement, JoinCode, now_wall, open_announcement

T0 = 1_764_500_000.0  # a fixed "now" for the tests of age


def ann(code: JoinCode, mid: bytes = b"m" * 8, fp: bytes = b"f" * 32, name: str = "alice",
        t: float | None = None) -> Announcement:
    return Announcement(code.session_id, mid, name, fp, "ordinary", ("100.64.0.11", 4000),
                        ("10.1.0.2", 4000), 1.5, {"bw": 1e9, "gpu": "RTX 4090"}, now_wall() if t is None else t)


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
    assert len({code.join_token[:16], code.announce_key[:16], code.punch_key[:16]}) == 3
    other = JoinCode("k7q2m9xd", "4f8tzr2w9mhcqp3b")
    assert other.announce_key != code.announce_key


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
    assert {len(ann(code, name="a" * n).seal(code)) for n in range(1, 60)} == {len(sealed)}
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
    with pytest.raises(ProtocolError, match="version 123, not 2"):
        open_announcement(v1, code, b"m" * 8)


def seal_raw(code: JoinCode, body: bytes) -> str:
    """Seal arbitrary bytes as a member would (it knows the secret): what the parser must survive."""
    nonce = secrets.token_bytes(12)
    return base64.b64encode(b"\x02" + nonce + ChaCha20Poly1305(code.announce_key).encrypt(
        nonce, body, trust._aad(code))).decode()


def test_a_members_malformed_body_is_a_protocol_error() -> None:
    code = JoinCode("k7q2m9xd", "0123456789abcdef")
    body = json.loads(ann(code).body())
    for change in ({"t": "NaN"}, {"t": None}, {"fp": "ab"}, {"nat": "weird"}, {"v": 1}):
        with pytest.raises(ProtocolError, match=r"malformed|fingerprint"):
            open_announcement(seal_raw(code, json.dumps({**body, **change}).encode()), code, b"m" * 8)
    with pytest.raises(ProtocolError, match="malformed"):
        open_announcement(seal_raw(code, b"[1, 2]"), code, b"m" * 8)  # was an AttributeError


FIELDS = st.fixed_dictionaries({}, optional={
    "v": st.sampled_from([2, 1, "2"]), "session": st.sampled_from(["k7q2m9xd", "x"]), "member": st.text(max_size=20),
    "name": st.text(max_size=10), "fp": st.sampled_from(["ab" * 32, "zz", ""]), "nat": st.text(max_size=10),
    "mapped": st.none() | st.lists(st.integers() | st.text(max_size=8), max_size=3),
    "local": st.none() | st.just(["10.0.0.1", 4]), "rtt_ms": st.none() | st.floats() | st.text(max_size=3),
    "m": st.dictionaries(st.text(max_size=4), st.integers(), max_size=3) | st.integers(),
    "t": st.floats() | st.text(max_size=4) | st.none(),
})


@settings(max_examples=300, deadline=None)
@given(st.one_of(FIELDS.map(lambda d: json.dumps(d).encode()), st.binary(max_size=200)))
def test_fuzz_sealed_bodies_from_a_member(body: bytes) -> None:
    """Any body sealed with the right key is an announcement or a ProtocolError/SessionError, nothing else."""
    code = JoinCode("k7q2m9xd", "0123456789abcdef")
    try:
        open_announcement(seal_raw(code, body), code, (b"m" * 8))
    except (ProtocolError, SessionError):
        pass


@settings(max_examples=150, deadline=None)
@given(name=st.text(max_size=64),
       measurements=st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=20), max_size=8),
       t=st.floats(T0 - 24 * 3600, T0 + 3600))
def test_round_trip_of_any_announcement_that_fits(name: str, measurements: dict[str, object], t: float) -> None:
    code = JoinCode("k7q2m9xd", "0123456789abcdef")
    a = Announcement(code.session_id, b"m" * 8, name, b"f" * 32, "ordinary", None, ("10.0.0.1", 4), None,
                     measurements, t)
    try:
        sealed = a.seal(code)
    except SessionError as exc:  # too big for one datagram: refused when made, never sent
        size = re.search(r"announcement is (\d+) bytes", str(exc))
        assert size is not None and int(size.group(1)) > trust.MAX_ANNOUNCEMENT
        return
    vm = open_announcement(sealed, code, b"m" * 8, now=T0)
    assert (vm.name, vm.measurements, vm.local) == (name, measurements, ("10.0.0.1", 4))
    assert vm.issued_at == round(t, 3) and len(sealed) <= 1300

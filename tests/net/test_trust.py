"""Join codes and MAC'd announcements."""

from __future__ import annotations

import base64
import json

import pytest

from kafila.errors import SessionError
from kafila.net.trust import Announcement, JoinCode, open_announcement


def ann(code: JoinCode, mid: bytes = b"m" * 8, fp: bytes = b"f" * 32) -> Announcement:
    return Announcement(code.session_id, mid, "alice", fp, "ordinary", ("100.64.0.11", 4000),
                        ("10.1.0.2", 4000), 1.5, {"bw": 1e9}, 1000.0)


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
    vm = open_announcement(ann(code).seal(code), code, b"m" * 8, ("1.2.3.4", 5))
    assert vm.fingerprint == b"f" * 32 and vm.nat_class.value == "ordinary" and vm.observed == ("1.2.3.4", 5)


def test_wrong_secret_tampering_and_replays_are_refused() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    outsider = JoinCode("k7q2m9xd", JoinCode.new_secret())
    with pytest.raises(SessionError, match="MAC"):
        open_announcement(ann(outsider).seal(outsider), code, b"m" * 8)
    sealed = base64.b64decode(ann(code).seal(code))
    body, tag = sealed[:-32], sealed[-32:]
    d = json.loads(body)
    d["fp"] = "ee" * 32  # a rendezvous swapping the fingerprint
    forged = base64.b64encode(json.dumps(d, separators=(",", ":"), sort_keys=True).encode() + tag).decode()
    with pytest.raises(SessionError, match="MAC"):
        open_announcement(forged, code, b"m" * 8)
    with pytest.raises(SessionError, match="announcement of"):
        open_announcement(ann(code).seal(code), code, b"x" * 8)  # listed under another member's id

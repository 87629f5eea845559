"""A member's announcement fits its one datagram in the largest case a user can make: a 32-character name, a
GPU, emulated slow-down, memory, link delay and link rate, its own model file, its punch key, and probe figures
whose 17-digit forms are longest, the names and keys random (what deflates least). Before, such an announcement
reached 917 bytes of the 900 allowed, and the member could not join; with the punch key and the link rate its
JSON is 952 bytes, so the body is deflated. So does a coordinator's, with the longest mandate chain a successor
announces (kafila.net.mandate)."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from kafila.errors import ProtocolError
from kafila.net.mandate import MAX_LINKS, Credential
from kafila.net.quic import Identity
from kafila.net.trust import (
    ANNOUNCE_VERSION,
    MAX_ANNOUNCEMENT,
    MAX_ANNOUNCEMENT_JSON,
    Announcement,
    JoinCode,
    _aad,
    open_announcement,
)
from kafila.session.coordinator.runtime import coordinator_announcement
from kafila.session.delivery.local_model import MODEL_KEY
from kafila.session.protocol.announcement import Emulation, measurements
from tests.shared_probe import sample_probe

pytestmark = pytest.mark.fast
CODE = JoinCode("k7q2m9xd", "4f8tzr2w9mhcqp3a")


def test_the_largest_announcement_fits_its_datagram() -> None:
    longest = 1.2345678901234567e-05  # as repr writes it: 22 characters
    probe = replace(sample_probe(), dispatch_s=longest, block_s=longest, unembed_s=longest,
                    prefill_dispatch_s=longest, prefill_block_s=longest, prefill_attn_s=longest,
                    device="NVIDIA GeForce RTX 4090", expert_rates=(("Q4_0", 3.3e8), ("MXFP4", 1.7e8)))
    m = {**measurements(probe, Emulation(throttle=2.5, memory_gb=3.75, link_delay_ms=999.25,
                                                    link_up_mbit=12345.675, link_down_mbit=99999.125)),
         "role": "member",
         MODEL_KEY: _random(32).hex()}
    ann = _largest(m)
    size = len(ann.packed())
    assert len(ann.body()) > MAX_ANNOUNCEMENT and size <= MAX_ANNOUNCEMENT - 200, size  # with room to spare
    assert open_announcement(ann.seal(CODE), CODE, ann.member_id).measurements == m
    assert m["disp"] == 3.086e-05  # 2.5 x 1.2345678901234567e-05 to 4 significant digits


def test_a_coordinator_announcing_the_longest_mandate_chain_fits_its_datagram() -> None:
    credential: Credential | None = Credential.new_host()
    for _ in range(MAX_LINKS):
        assert credential is not None
        credential = credential.delegate(Identity().key, "k7q2m9xd", Identity().fingerprint)
    assert credential is not None and len(credential.links) == MAX_LINKS
    ann = _largest(coordinator_announcement(credential))
    assert len(ann.packed()) <= MAX_ANNOUNCEMENT - 200, len(ann.packed())


def test_a_body_that_inflates_past_its_bound_is_refused_unread() -> None:
    m = {"pad": "a" * (MAX_ANNOUNCEMENT_JSON + 1)}  # deflates to a few bytes, so the seal would take it
    ann = _largest({})
    body = ann.body().replace(b'"m":{}', b'"m":' + json.dumps(m).encode())
    sealed = _seal_raw(zlib.compress(body, 9))
    with pytest.raises(ProtocolError, match="too large"):
        open_announcement(sealed, CODE, ann.member_id)


def _seal_raw(packed: bytes) -> str:
    """`packed` sealed as Announcement.seal seals a body (a body no honest member would make)."""
    nonce = bytes(12)
    sealed = ChaCha20Poly1305(CODE.announce_key).encrypt(nonce, packed.ljust(128, b"\0"), _aad(CODE))
    return base64.b64encode(bytes([ANNOUNCE_VERSION]) + nonce + sealed).decode()


def _random(n: int, salt: bytes = b"") -> bytes:
    return hashlib.sha256(salt + n.to_bytes(2, "big")).digest()[:n]


def _largest(m: dict[str, object]) -> Announcement:
    name = base64.b32encode(_random(20, b"name")).decode()[:32]
    return Announcement(CODE.session_id, _random(8, b"id"), name, _random(32, b"fp"), "ordinary",
                        ("203.0.113.200", 40000), ("192.168.100.200", 40001), 123.45, m, 1.8e9,
                        punch_public=_random(32, b"pk"))

"""A member's announcement fits its one datagram in the largest case a user can make: a 32-character name, a
GPU, emulated slow-down, memory, link delay and link rate, its own model file, and probe figures whose 17-digit
forms are longest. Before, such an announcement reached 917 bytes of the 900 allowed, and the member could not
join. So does a coordinator's, with the longest mandate chain a successor announces (kafila.net.mandate)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kafila.net.mandate import MAX_LINKS, Credential
from kafila.net.quic import Identity
from kafila.net.trust import MAX_ANNOUNCEMENT, Announcement
from kafila.session.coordinator.runtime import coordinator_announcement
from kafila.session.delivery.local_model import MODEL_KEY
from kafila.session.protocol.announcement import Emulation, measurements
from tests.shared_probe import sample_probe

pytestmark = pytest.mark.fast


def test_the_largest_announcement_fits_its_datagram() -> None:
    longest = 1.2345678901234567e-05  # as repr writes it: 22 characters
    probe = replace(sample_probe(), dispatch_s=longest, block_s=longest, unembed_s=longest,
                    prefill_dispatch_s=longest, prefill_block_s=longest, prefill_attn_s=longest,
                    device="NVIDIA GeForce RTX 4090", expert_rates=(("Q4_0", 3.3e8), ("MXFP4", 1.7e8)))
    m = {**measurements(probe, Emulation(throttle=2.5, memory_gb=3.75, link_delay_ms=999.25,
                                                    link_up_mbit=12345.675, link_down_mbit=99999.125)),
         "role": "member",
         MODEL_KEY: "c" * 64}
    ann = Announcement("k7q2m9xd", b"m" * 8, "x" * 32, b"f" * 32, "ordinary", ("203.0.113.200", 40000),
                       ("192.168.100.200", 40001), 123.45, m, 1.8e9)
    size = len(ann.body())
    assert size <= MAX_ANNOUNCEMENT - 20, size  # with room to spare
    assert m["disp"] == 3.086e-05  # 2.5 x 1.2345678901234567e-05 to 4 significant digits


def test_a_coordinator_announcing_the_longest_mandate_chain_fits_its_datagram() -> None:
    credential: Credential | None = Credential.new_host()
    for _ in range(MAX_LINKS):
        assert credential is not None
        credential = credential.delegate(Identity().key, "k7q2m9xd", Identity().fingerprint)
    assert credential is not None and len(credential.links) == MAX_LINKS
    ann = Announcement("k7q2m9xd", b"m" * 8, "x" * 32, b"f" * 32, "ordinary", ("203.0.113.200", 40000),
                       ("192.168.100.200", 40001), 123.45, coordinator_announcement(credential), 1.8e9)
    assert len(ann.body()) <= MAX_ANNOUNCEMENT - 20, len(ann.body())

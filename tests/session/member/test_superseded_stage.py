"""A stage transfer that a re-plan supersedes resumes from its `.part` in the next epoch.

A real member (MemberRuntime) receives a real stage (blocks [0, 3) cut from the embedded SmolLM2) from the
test, its coordinator, over a real QUIC control link (tests/session/scripted.py), chunks sent by the host's
own sender (delivery.transfer.send_stage). In epoch 1 the member asks for every chunk; after the first
half of them the coordinator gives the epoch up (a member lost) and assigns the same stage again in epoch 2.
The member drops the transfer without deleting what arrived, asks in epoch 2 for the other half only, and
the stage it then verifies and loads is the host's, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import messages
from tests.session.scripted import assign, host_stage, member

pytestmark = pytest.mark.fast


async def test_a_transfer_superseded_by_a_replan_resumes_its_part_in_the_next_epoch(tmp_path: Path) -> None:
    source, manifest = host_stage(tmp_path)
    n = len(manifest.chunks)
    first, rest = list(range(n // 2)), list(range(n // 2, n))
    async with member(tmp_path, "ada", others=[]) as m:
        await m.host.send(assign(1, manifest))
        assert await m.first(messages.Need) == messages.Need(1, tuple(range(n)))
        assert await send_stage(m.host.inbox.link, source, manifest, first) == len(first) * manifest.chunk_size
        await m.host.send(messages.Lost("cy", "gone while ada's stage travelled", 1))  # epoch 1 is given up
        await m.host.send(assign(2, manifest))  # the same stage in the next plan
        need = await m.first(messages.Need, lambda x: x.epoch == 2)
        assert need.chunks == tuple(rest), f"epoch 2 asked for {need.chunks}, {first} were already here"
        part = m.cache.root / "delivered" / f"{manifest.sha256}.part"
        assert part.is_file()
        await send_stage(m.host.inbox.link, source, manifest, list(need.chunks))
        assert await m.first(messages.Loaded) == messages.Loaded(2)
        assert m.host.inbox.of(messages.Loaded) == [messages.Loaded(2)]  # nothing loaded in epoch 1
        held = m.cache.root / "delivered" / f"{manifest.sha256}.gguf"
        assert held.read_bytes() == source.read_bytes() and not part.exists()
        assert "epoch 1's stage is no longer wanted: the host planned again" in [t for _, t in m.runtime.state.events]
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0

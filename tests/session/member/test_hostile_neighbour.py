"""A ring neighbour that sends a sequence id outside the admitted slots is refused and reported lost; the stage
never hands it to llama.cpp, which aborted the whole process on `free`/`trim` of a sequence past 255 (issue 34
item 4: exit 134) and made a body stage exit on others.

A real member (MemberRuntime) loads a real stage and serves as the body of the ring (bo, ada); the test is
its coordinator (tests/session/scripted.py) and drives bo, its predecessor, over a real QUIC ring edge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import frames, messages
from kafila.session.protocol.frames import ActivationHeader, Frame, Phase
from tests.session.scripted import CONFIG, assign, host_stage, member

pytestmark = pytest.mark.fast

WIDTH = 576  # SmolLM2-135M's hidden size: the stage's rows


def bad_frame(seq: int) -> bytes:
    header = ActivationHeader(1, Phase.PREFILL, (0,), 1, WIDTH, seqs=(seq,))
    return frames.encode(Frame(header, np.zeros((1, WIDTH), np.float32)))


@pytest.mark.parametrize(("sent", "seq"), [
    (messages.encode(messages.Free(256)), 256),
    (messages.encode(messages.Trim(65535, 0)), 65535),
    (messages.encode(messages.Free(1)), 1),  # the first id past this session's one slot
    (bad_frame(256), 256),
], ids=["free-256", "trim-65535", "free-1", "frame-256"])
async def test_a_sequence_outside_the_slots_is_refused_and_its_sender_reported_lost(tmp_path: Path, sent: bytes,
                                                                                   seq: int) -> None:
    source, manifest = host_stage(tmp_path)
    async with member(tmp_path, "ada", others=["bo"]) as m:
        fps = {"ada": m.runtime.ep.identity.fingerprint.hex(), "bo": m.others["bo"].identity.fingerprint.hex()}
        await m.host.send(assign(1, manifest, fps))
        need = await m.first(messages.Need)
        await send_stage(m.host.inbox.link, source, manifest, list(need.chunks))
        assert await m.first(messages.Loaded) == messages.Loaded(1)
        bo = m.others["bo"]
        ring = {vm.name: vm for vm in (await bo.members()).verified if vm.name in ("ada", "bo")}
        await m.host.send(messages.Connect(1))
        edges = await bo.open_ring([ring["bo"], ring["ada"]])
        await m.first(messages.Ready)
        await m.host.send(messages.Admit(1))
        assert edges.next is not None
        await edges.next.send(sent)  # bo -> ada: ada's predecessor's edge
        lost = await m.first(messages.Lost)
        slots = CONFIG["n_seq_max"]
        assert lost == messages.Lost("bo", f"sequence {seq} is outside the admitted {slots} slots", 1)
        assert not m.run.done()  # ada is alive and waits for its coordinator's re-plan
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0

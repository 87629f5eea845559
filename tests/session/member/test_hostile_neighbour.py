"""A ring neighbour that sends a sequence id outside the admitted slots is refused and reported lost; the stage
never hands it to llama.cpp, which aborted the whole process on `free`/`trim` of a sequence past 255 (issue 34
item 4: exit 134) and made a body stage exit on others.

A real member (MemberRuntime) loads a real stage and serves as the body of the ring (bo, ada); the test is
its coordinator (tests/session/scripted.py) and drives bo, its predecessor, over a real QUIC ring edge.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from kafila.net.ring import RingEdges
from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import frames, messages
from kafila.session.protocol.frames import ActivationHeader, Frame, Phase
from tests.session.scripted import CONFIG, MemberUnderTest, assign, host_stage, member

pytestmark = pytest.mark.fast

WIDTH = 576  # SmolLM2-135M's hidden size: the stage's rows


def bad_frame(seq: int) -> bytes:
    header = ActivationHeader(1, Phase.PREFILL, (0,), 1, WIDTH, seqs=(seq,))
    return frames.encode(Frame(header, np.zeros((1, WIDTH), np.float32)))


def frame_of(rows: int = 1, width: int = WIDTH, positions: tuple[int, ...] = (0,), nan: bool = False) -> bytes:
    """A frame of sequence 0 (on the wire: a position of -1 goes as the u32 it is sent as)."""
    header = ActivationHeader(1, Phase.PREFILL, tuple(p & 0xFFFFFFFF for p in positions), rows, width,
                              seqs=(0,) * rows)
    values = np.full((rows, width), 0.5, np.float32)
    if nan:
        values[rows - 1, 3] = np.nan
    return frames.encode(Frame(header, values))


@contextlib.asynccontextmanager
async def serving_body(tmp_path: Path) -> AsyncIterator[tuple[MemberUnderTest, RingEdges]]:
    """ada serving the body of a ring (bo, ada) on a real stage; the test is bo: its edges (next: into ada)."""
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
        assert edges.next is not None and edges.prev is not None
        yield m, edges


N_BATCH, N_CTX = CONFIG["n_batch"], CONFIG["n_ctx_per_seq"]
CASES = {  # what bo sends first (a well-formed frame of positions 0..1 went before each), and ada's words for it
    "rows-past-n_batch": (frame_of(N_BATCH + 1, positions=tuple(range(2, N_BATCH + 3))),
                          f"has {N_BATCH + 1} rows; a call carries 1 to {N_BATCH} (n_batch)"),
    "width-7": (frame_of(1, 7, (2,)), f"has rows of width 7; the model's is {WIDTH}"),
    "position-jump": (frame_of(1, positions=(5,)), "sequence 0 at position 5, but its cache ends at 2"),
    "past-the-context": (frame_of(2, positions=(N_CTX, N_CTX + 1)), f"past the context of {N_CTX}"),
    "position-minus-1": (frame_of(1, positions=(-1,)), f"at position {2**32 - 1}, past the context"),
    "duplicate-positions": (frame_of(2, positions=(2, 2)), "sequence 0 at position 2, but its cache ends at 3"),
    "repeated-position": (frame_of(1, positions=(1,)), "sequence 0 at position 1, but its cache ends at 2"),
    "nan-row": (frame_of(2, positions=(2, 3), nan=True), "a value that is not finite (NaN or infinity) in row 1"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_malformed_frame_is_its_senders_fault_and_the_stage_stays_up(tmp_path: Path, case: str) -> None:
    # issue 55, finding 2: before, llama.cpp's refusal (n_batch, width) made ada report itself lost and leave,
    # and llama.cpp took the bad positions and NaN rows
    sent, words = CASES[case]
    async with serving_body(tmp_path) as (m, edges):
        into_ada = edges.next
        assert into_ada is not None
        await into_ada.send(frame_of(2, positions=(0, 1)))  # an honest frame first: ada's cache holds 0..1
        await into_ada.send(sent)
        lost = await m.first(messages.Lost)
        assert lost.who == "bo" and lost.epoch == 1, lost  # the sender, never ada itself
        assert words in lost.reason, lost.reason
        assert not m.run.done()  # ada is alive and waits for its coordinator's re-plan
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0


@pytest.mark.parametrize(("sent", "seq"), [
    (messages.encode(messages.Free(256)), 256),
    (messages.encode(messages.Trim(65535, 0)), 65535),
    (messages.encode(messages.Free(1)), 1),  # the first id past this session's one slot
    (messages.encode(messages.Fork(0, 300, 4)), 300),  # a fork into a sequence past the slots
    (messages.encode(messages.Fork(257, 0, 4)), 257),  # ... and from one
    (bad_frame(256), 256),
], ids=["free-256", "trim-65535", "free-1", "fork-into-300", "fork-from-257", "frame-256"])
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


async def test_a_control_message_its_predecessor_may_not_send_is_dropped_not_passed_on(tmp_path: Path) -> None:
    """Issue 55 (authority in one place): chats travel from a member toward the head, so none comes from the
    head, bo, on its edge to ada; one that claims to (naming ada as its origin, to take ada's prompt cache)
    is refused and dropped, neither passed on nor taken for a loss. The head's chat_evt that follows, for
    another member, is passed on as ever (the edge delivers in order: it shows the chat went nowhere)."""
    async with serving_body(tmp_path) as (m, edges):
        assert edges.next is not None and edges.prev is not None
        evt = messages.ChatEvt("cy-0", "cy", {"notice": "for someone else"})
        await edges.next.send(messages.encode(messages.Chat("ada-9", "ada", {"messages": []})))
        await edges.next.send(messages.encode(evt))
        assert messages.decode(await edges.prev.recv(30)) == evt  # back round to bo: the chat was dropped
        assert not m.host.inbox.of(messages.Lost) and not m.run.done()
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0

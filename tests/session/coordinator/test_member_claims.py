"""What a member says that the coordinator must not take at its word.

A member whose announced measurements cannot be planned with (NaN, negative, missing: JSON carries NaN and
infinities) is refused at the door with the reason (issue 34's untested guards): before, it was admitted, and
planning over it raised inside the epoch and ended the session for everyone. A member that names stage chunks
again and again gets each once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafila.model.stage_cache import StageCache
from kafila.session.delivery.local_model import MODEL_KEY, _read_stream, model_proof
from kafila.session.protocol import messages
from tests.session.scripted import ScriptedMember, coordinator, member_measurements
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("changed", "named"), [
    ({"bw": float("nan")}, "bandwidth"),
    ({"disp": float("inf")}, "dispatch_s"),
    ({"pbw": -1.0}, "prefill_bandwidth"),
    ({"mem": 0}, "memory"),
])
async def test_unusable_measurements_are_refused_at_the_door(tmp_path: Path, changed: dict[str, float],
                                                             named: str) -> None:
    model = write_synthetic(tmp_path / "tiny.gguf", "llama", n_blocks=6)
    async with coordinator(tmp_path, model, ["ada", "bo"], announced={"bo": {**member_measurements(), **changed}}) as c:
        refused = await c.members["bo"].inbox.first(messages.Refused)
        assert refused.reason == f"member bo announced unusable measurements ({named})"
        await asyncio.sleep(0.2)  # whatever else happens next has its chance
        assert c.state.members["bo"].status == "refused" and c.state.members["ada"].status != "refused"
        assert not c.run.done() and c.state.phase not in ("rejected", "ended")  # the session goes on waiting


async def asks_again_and_again(m: ScriptedMember, msg: messages.Assign) -> None:
    """`need` with each index many times, one past the end, and the same `need` twice."""
    need = messages.Need(msg.epoch, (0,) * 500 + (1, 1, 10**6))
    await m.send(need)
    await m.send(need)


async def test_a_need_with_repeated_indices_gets_each_chunk_once(tmp_path: Path) -> None:
    # issue 34 item 13: the host sent a chunk once per time it was named, without end
    model = write_synthetic(tmp_path / "tiny.gguf", "llama", n_blocks=6)
    async with coordinator(tmp_path, model, ["ada"], on_assign={"ada": asks_again_and_again}) as c:
        ada = c.members["ada"]
        manifest = (await ada.inbox.first(messages.Assign)).stage
        wanted = [i for i in (0, 1) if i < len(manifest.chunks)]
        async with asyncio.timeout(60):
            while len(ada.inbox.chunks) < len(wanted) or c.runtime._sending:
                await asyncio.sleep(0.05)
        assert sorted(ada.inbox.chunks) == wanted


@pytest.mark.parametrize("holds", [True, False])
async def test_a_member_claiming_the_model_must_prove_it_holds_the_file(tmp_path: Path, holds: bool) -> None:
    # issue 34 item 6: a member announcing the host's model hash became a holder (it cuts its own stages, and
    # can become the heir that sends survivors their stages) on its word alone
    model = write_synthetic(tmp_path / "tiny.gguf", "llama", n_blocks=6)
    claim = {**member_measurements(), MODEL_KEY: StageCache(tmp_path / "hashes").source_hash(model)}
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(model.read_bytes())
    async with coordinator(tmp_path, model, ["ada", "bo"], announced={"bo": claim},
                           models={"bo": copy} if holds else None) as c:
        prove = await c.members["bo"].inbox.first(messages.Prove)
        assert len(prove.nonce) == 64
        if holds:
            await c.reach("admitted")
            assert c.state.members["bo"].status != "refused"
        else:
            refused = await c.members["bo"].inbox.first(messages.Refused)
            assert refused.reason == ("bo announced the host's model hash but did not prove it holds the file "
                                      "(pieces of it the host chose): its proof does not match the host's file")


def test_a_proof_reads_a_split_model_as_one_stream(tmp_path: Path) -> None:
    whole = bytes(range(256)) * 200  # 51,200 bytes
    one = tmp_path / "m.gguf"
    one.write_bytes(whole)
    parts = [tmp_path / f"m-0000{i}.part" for i in (1, 2, 3)]
    for part, (a, b) in zip(parts, ((0, 20000), (20000, 20001), (20001, len(whole))), strict=True):
        part.write_bytes(whole[a:b])
    sizes = [p.stat().st_size for p in parts]
    for offset, n in ((19998, 5), (0, 4096), (51000, 4096), (20000, 1)):  # across files, at the start and end
        assert _read_stream(parts, sizes, offset, n) == whole[offset:offset + n]
    assert model_proof(one, bytes(32)) == model_proof(one, bytes(32)) != model_proof(one, b"\1" * 32)


async def test_measurements_sent_after_arriving_are_judged_when_they_come(tmp_path: Path) -> None:
    # issue 59: a member connects before it measures; the host shows its progress and judges what it sends later
    model = write_synthetic(tmp_path / "tiny.gguf", "llama", n_blocks=6)
    first = {k: v for k, v in member_measurements().items() if k in ("role", "build", "proto")}
    arriving = {**first, messages.MEASURING_KEY: True}
    async with coordinator(tmp_path, model, ["ada", "bo"], announced={"ada": arriving, "bo": arriving}) as c:
        ada, bo = c.members["ada"], c.members["bo"]
        await bo.send(messages.Measuring("timing decode calls (attempt 2 of 3)", 2, False, 12.0))
        async with asyncio.timeout(60):
            while "attempt 2 of 3" not in c.state.members["bo"].note:
                await asyncio.sleep(0.05)
        assert c.state.members["bo"].status == "measuring" and not c.runtime.machine.peers, c.log()
        assert "bo is measuring: timing decode calls (attempt 2 of 3)" in c.log()
        await bo.send(messages.MeasuredSelf({**member_measurements(), "bw": float("nan")}))
        refused = await bo.inbox.first(messages.Refused)
        assert refused.reason == "member bo announced unusable measurements (bandwidth)"
        await ada.send(messages.MeasuredSelf(member_measurements()))
        async with asyncio.timeout(60):
            while "ada" not in c.runtime.machine.peers:
                await asyncio.sleep(0.05)
        assert c.state.members["bo"].status == "refused" and "bo" not in c.runtime.machine.peers, c.log()
        assert c.state.members["ada"].status == "measured", c.log()
        assert c.runtime.machine.peers["ada"].measurements["bw"] == 1e10  # what it sent, not what it announced
        assert "ada measured its machine in" in c.log() and "ada joined (1/2)" in c.log()

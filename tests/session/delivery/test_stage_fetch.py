"""A member's stage from several real HTTP sources at once: a liar dropped, a stall replaced, a restart resumed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafila.model.cut import StageSpec, write_stage
from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.chunk_scheduler import ChunkScheduler, Kind
from kafila.session.delivery.model_chunks import ChunkStore, model_manifest
from kafila.session.delivery.stage_chunks import cut_and_check
from kafila.session.delivery.stage_fetch import fetch_stage
from kafila.session.delivery.stage_files import manifest_for
from kafila.session.delivery.url_source import UrlLimits, UrlSource
from tests.session.delivery.range_server import Behaviour, range_server

pytestmark = pytest.mark.fast
SPEC = StageSpec(2, 4, False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The model (35 MB, 6 blocks) and a copy of it with one byte changed in every chunk (a lying peer's)."""
    d = tmp_path_factory.mktemp("models")
    model = write_random_gguf(d / "m.gguf", TEST_SHAPE, 6, tokenizer=False)
    lie = bytearray(model.read_bytes())
    for at in range(100, len(lie), 1 << 20):
        lie[at] ^= 0xFF
    (d / "lie.gguf").write_bytes(lie)
    return model, d / "lie.gguf"


def expected_stage(model: Path, folder: Path) -> Path:
    return write_stage(model, SPEC, folder / "whole-cut.gguf")


async def test_a_stage_from_a_url_and_a_lying_peer_with_the_host_asked_for_nothing(
        files: tuple[Path, Path], tmp_path: Path) -> None:
    model, lie = files
    manifest = model_manifest(tmp_path, model)
    told: list[str] = []
    host_b, url_b, liar_b = Behaviour(model), Behaviour(model), Behaviour(lie)
    async with range_server(host_b) as host, range_server(url_b) as url, range_server(liar_b) as liar, \
            UrlSource(f"{host.url}/model.gguf", manifest) as host_src, \
            UrlSource(f"{url.url}/redirect", manifest) as url_src, \
            UrlSource(f"{liar.url}/model.gguf", manifest) as liar_src:
        liar_src.name = "peer bo"
        await url_src.check()
        scheduler = ChunkScheduler()
        scheduler.add_source("host", Kind.HOST, slots=4)
        scheduler.add_source(url_src.name, Kind.URL, slots=4)
        scheduler.add_source("peer bo", Kind.PEER, holds=range(manifest.n_chunks), slots=4)
        store = ChunkStore(tmp_path / "store", manifest)
        needed = await fetch_stage(store, SPEC, scheduler, {"host": host_src, url_src.name: url_src,
                                                             "peer bo": liar_src}, tell=told.append)
    expected = expected_stage(model, tmp_path)
    got = cut_and_check(store, SPEC, tmp_path / "sparse-cut.gguf", manifest_for(expected))
    assert got.read_bytes() == expected.read_bytes()
    assert told == [told[0]] and told[0].startswith("dropped peer bo for the rest of the session: chunk ")
    assert host_b.asked == []  # the URL held every chunk: the host's uplink carried nothing
    assert store.held() == needed and len(needed) < manifest.n_chunks / 2
    print(f"stage {SPEC.tag}: {len(needed)} of {manifest.n_chunks} chunks; the liar was asked {len(liar_b.asked)}")


async def test_a_stalled_url_is_replaced_by_the_host(files: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = files
    manifest = model_manifest(tmp_path, model)
    told: list[str] = []
    stalling = Behaviour(model, stalls=10**6, stall_after=1000)  # every response stops after 1,000 bytes
    async with range_server(Behaviour(model)) as host, range_server(stalling) as url, \
            UrlSource(f"{host.url}/model.gguf", manifest) as host_src, \
            UrlSource(f"{url.url}/model.gguf", manifest, UrlLimits(stall_s=0.2, backoff_s=0.01)) as url_src:
        scheduler = ChunkScheduler(stall_s=1.0, rest_s=600)
        scheduler.add_source("host", Kind.HOST, slots=4)
        scheduler.add_source(url_src.name, Kind.URL, slots=4)
        store = ChunkStore(tmp_path / "store", manifest)
        await asyncio.wait_for(fetch_stage(store, SPEC, scheduler, {"host": host_src, url_src.name: url_src},
                                           tell=told.append), 60)
    expected = expected_stage(model, tmp_path)
    assert cut_and_check(store, SPEC, tmp_path / "cut.gguf", manifest_for(expected)).read_bytes() == \
        expected.read_bytes()
    assert told == [f"{url_src.name} stalled (nothing for 1 s); its chunks are asked elsewhere for 600 s"]


async def test_a_restart_mid_transfer_asks_only_for_what_is_missing(files: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = files
    manifest = model_manifest(tmp_path, model)
    behaviour = Behaviour(model, pace_s=0.05)  # slow enough to stop it halfway
    async with range_server(behaviour) as url:
        async with UrlSource(f"{url.url}/model.gguf", manifest) as src:
            store = ChunkStore(tmp_path / "store", manifest)
            run = asyncio.create_task(fetch_stage(store, SPEC, one_url(src), {src.name: src}))
            while len(store.held()) < 6:
                await asyncio.sleep(0.005)
            run.cancel()  # the member stops mid-transfer
            await asyncio.gather(run, return_exceptions=True)
        before = ChunkStore(tmp_path / "store", manifest).held()  # a new process: what verified is kept
        assert 6 <= len(before) < 14  # the header and some of the stage's 13 chunks
        behaviour.asked.clear()
        async with UrlSource(f"{url.url}/model.gguf", manifest) as src:
            store = ChunkStore(tmp_path / "store", manifest)
            needed = await fetch_stage(store, SPEC, one_url(src), {src.name: src})
    asked = sorted({start // manifest.chunk_size for start, _ in behaviour.asked})
    assert asked == sorted(set(needed) - set(before))
    assert not set(asked) & set(before)


def one_url(src: UrlSource) -> ChunkScheduler:
    scheduler = ChunkScheduler()
    scheduler.add_source(src.name, Kind.URL, slots=2)
    return scheduler


"""Chunks from a public URL over HTTP Range requests, against a real server on 127.0.0.1 (range_server.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kafila.errors import NetworkError
from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.net.rate import RateQueue
from kafila.session.delivery.model_chunks import ChunkRefused, ChunkStore, model_manifest
from kafila.session.delivery.url_source import UrlLimits, UrlRefused, UrlSource
from tests.session.delivery.range_server import Behaviour, range_server

pytestmark = pytest.mark.fast
QUICK = UrlLimits(stall_s=0.5, backoff_s=0.01, backoff_max_s=0.05)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The model (35 MB) and another file of another size."""
    d = tmp_path_factory.mktemp("models")
    return (write_random_gguf(d / "m.gguf", TEST_SHAPE, 6, tokenizer=False),
            write_random_gguf(d / "other.gguf", TEST_SHAPE, 5, tokenizer=False))


async def test_every_chunk_through_redirects_then_resumed_after_a_restart(models: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    model = models[0]
    manifest = model_manifest(tmp_path, model)
    async with range_server(Behaviour(model)) as server, UrlSource(f"{server.url}/redirect", manifest) as src:
        await src.check()
        store = ChunkStore(tmp_path / "store", manifest)
        for i in range(0, manifest.n_chunks, 2):
            store.accept(i, await src.fetch(i), src.name)
        store = ChunkStore(tmp_path / "store", manifest)  # a restart: half the chunks are kept
        assert store.missing(range(manifest.n_chunks)) == list(range(1, manifest.n_chunks, 2))
        server.behaviour.asked.clear()
        for i in store.missing(range(manifest.n_chunks)):
            store.accept(i, await src.fetch(i), src.name)
        assert [a // manifest.chunk_size for a, _ in server.behaviour.asked] == list(range(1, manifest.n_chunks, 2))
    assert store.finish().read_bytes() == model.read_bytes()


@pytest.mark.parametrize("path", ["/model.gguf", "/redirect"])
async def test_a_url_serving_another_file_is_refused_in_one_line(path: str, models: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    model, other = models
    manifest = model_manifest(tmp_path, model)
    async with range_server(Behaviour(other)) as server, UrlSource(server.url + path, manifest) as src:
        with pytest.raises(UrlRefused) as refused:
            await src.check()
    assert str(refused.value) == (f"{server.url}{path} serves another file: {other.stat().st_size} bytes, where "
                                  f"the host's model has {manifest.size} bytes")
    same_size = tmp_path / "same-size.gguf"  # the right size, other bytes: the first chunk's hash tells
    same_size.write_bytes(bytes(manifest.size))
    async with range_server(Behaviour(same_size)) as server, UrlSource(server.url + path, manifest) as src:
        with pytest.raises(UrlRefused, match=r"serves another file: its first 1048576 bytes do not match") as refused:
            await src.check()
    assert "\n" not in str(refused.value)
    # a chunk it sends anyway is refused by the store, naming the URL
    with pytest.raises(ChunkRefused, match=f"from URL {server.url}{path} does not match"):
        ChunkStore(tmp_path / "store", manifest).accept(0, same_size.read_bytes()[: manifest.chunk_size],
                                                        f"URL {server.url}{path}")


async def test_a_url_without_range_support_is_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, models[0])
    async with range_server(Behaviour(models[0], no_range=True)) as server, \
            UrlSource(f"{server.url}/model.gguf", manifest) as src:
        with pytest.raises(UrlRefused, match="does not answer HTTP Range requests"):
            await src.check()


async def test_a_stalled_connection_is_replaced_keeping_what_arrived(models: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    model = models[0]
    manifest = model_manifest(tmp_path, model)
    behaviour = Behaviour(model, stalls=2, stall_after=300_000)
    async with range_server(behaviour) as server, UrlSource(f"{server.url}/model.gguf", manifest, QUICK) as src:
        data = await src.fetch(7)
    start, end = manifest.span(7)
    assert data == model.read_bytes()[start:end]
    # each new request began where the bytes stopped: nothing that arrived was asked again
    assert behaviour.asked[:2] == [(start, end), (start + 300_000, end)] and (start + 600_000, end) in behaviour.asked
    assert all(e == end for _, e in behaviour.asked) and sorted(s for s, _ in behaviour.asked) == \
        [s for s, _ in behaviour.asked]
    assert src.bytes_received == end - start and src.retries == len(behaviour.asked) - 1 >= 2


async def test_failing_requests_are_retried_with_back_off_then_given_up(models: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    model = models[0]
    manifest = model_manifest(tmp_path, model)
    behaviour = Behaviour(model, fail=3)
    async with range_server(behaviour) as server, UrlSource(f"{server.url}/model.gguf", manifest, QUICK) as src:
        t0 = time.monotonic()
        data = await src.fetch(1)
        waited = time.monotonic() - t0
        assert data == model.read_bytes()[slice(*manifest.span(1))] and src.retries == 3
        assert waited >= 0.01 + 0.02 + 0.04  # the back-off doubled between tries
        behaviour.fail = 100
        with pytest.raises(NetworkError, match=r"gave no bytes of chunk 2 in 6 tries in a row \(last: HTTP 503\)"):
            await src.fetch(2)


async def test_an_emulated_downlink_paces_what_a_url_sends(models: tuple[Path, Path], tmp_path: Path) -> None:
    """EMULATION `--link-rate`: the chunks arrive no faster than the member's downlink, which counts them."""
    model = models[0]
    manifest = model_manifest(tmp_path, model)
    downlink = RateQueue(8e6)  # 64 Mbit/s
    async with range_server(Behaviour(model)) as server, \
            UrlSource(f"{server.url}/model.gguf", manifest, downlink=downlink) as src:
        t0 = time.monotonic()
        got = b"".join([await src.fetch(i) for i in range(3)])
        took = time.monotonic() - t0
    assert got == model.read_bytes()[:len(got)] and downlink.passed == len(got) > 2e6
    assert took >= (len(got) - downlink.burst) / downlink.rate, took  # 3 MB at 8 MB/s: 0.39 s at the least

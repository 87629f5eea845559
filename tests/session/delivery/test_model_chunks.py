"""The verified sparse model store: chunks checked before they are written, resume, reads of held chunks only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kafila.errors import ProtocolError
from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.model_chunks import ChunkRefused, ChunkStore, UnverifiedRead, model_manifest
from kafila.session.protocol.model_manifest import ModelManifest

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 35 MB random-weight GGUF (34 chunks)."""
    return write_random_gguf(tmp_path_factory.mktemp("model") / "m.gguf", TEST_SHAPE, 6, tokenizer=False)


def chunk_of(model: Path, manifest: ModelManifest, i: int) -> bytes:
    start, end = manifest.span(i)
    with model.open("rb") as f:
        f.seek(start)
        return f.read(end - start)


def test_the_host_hashes_a_model_once(model: Path, tmp_path: Path) -> None:
    heard: list[int] = []
    first = model_manifest(tmp_path, model, lambda done, total: heard.append(done))
    assert heard and first.size == model.stat().st_size and first.n_chunks == 34
    heard.clear()
    assert model_manifest(tmp_path, model, lambda done, total: heard.append(done)) == first
    assert heard == []  # read from the record, not hashed again
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))  # the file may have changed
    assert model_manifest(tmp_path, model, lambda done, total: heard.append(done)) == first
    assert heard


def test_a_chunk_that_fails_its_hash_is_refused_naming_its_source(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    store = ChunkStore(tmp_path / "store", manifest)
    good = chunk_of(model, manifest, 3)
    with pytest.raises(ChunkRefused, match="chunk 3 of the model from peer bo does not match") as refused:
        store.accept(3, good[:-1] + bytes([good[-1] ^ 1]), "peer bo")
    assert (refused.value.index, refused.value.source) == (3, "peer bo")
    assert not store.holds(3)
    with pytest.raises(ProtocolError, match="chunk 34 from x is outside the model's 34 chunks"):
        store.accept(34, good, "x")
    store.accept(3, good, "peer cy")
    assert store.held() == [3] and store.read(3) == good


def test_an_unverified_read_is_an_error_never_zeros(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    store = ChunkStore(tmp_path / "store", manifest)
    store.accept(0, chunk_of(model, manifest, 0), "host")
    assert store.read_range(10, 20) == chunk_of(model, manifest, 0)[10:20]
    with pytest.raises(UnverifiedRead, match=r"chunks \[1\] not held"):
        store.read_range(manifest.chunk_size - 5, manifest.chunk_size + 5)
    with pytest.raises(UnverifiedRead):
        store.read(2)
    assert store.prefix(10**9) == chunk_of(model, manifest, 0) and store.prefix(7) == chunk_of(model, manifest, 0)[:7]
    assert store.prefix_chunks() == 1


def test_resume_after_a_restart_keeps_only_chunks_that_still_verify(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    store = ChunkStore(tmp_path / "store", manifest)
    for i in (0, 5, 33):
        store.accept(i, chunk_of(model, manifest, i), "url")
    again = ChunkStore(tmp_path / "store", manifest)  # a new process: the bitmap and the .part survive
    assert again.held() == [0, 5, 33]
    with store.part.open("r+b") as f:  # a crash lost chunk 5's bytes after its bit was written
        f.seek(5 * manifest.chunk_size + 100)
        f.write(b"\0" * 8)
    assert ChunkStore(tmp_path / "store", manifest).held() == [0, 33]


def test_every_chunk_makes_the_whole_file(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    store = ChunkStore(tmp_path / "store", manifest)
    with pytest.raises(UnverifiedRead, match="34 chunks missing"):
        store.finish()
    for i in reversed(range(manifest.n_chunks)):
        store.accept(i, chunk_of(model, manifest, i), "host")
    final = store.finish()
    assert final.read_bytes() == model.read_bytes() and not store.part.exists() and not store.sidecar.exists()
    assert ChunkStore(tmp_path / "store", manifest).complete  # a later session finds the whole file


def test_members_on_one_machine_share_the_store_without_losing_each_others_chunks(model: Path, tmp_path: Path) -> None:
    """Two stores of one folder (two members of a demo, or of a lab sharing a cache): a second one opened later
    keeps what the first wrote (it once truncated the `.part`), and each sees the other's verified chunks."""
    m = model_manifest(tmp_path, model)
    folder = tmp_path / "models"
    ada = ChunkStore(folder, m)
    ada.accept(0, chunk_of(model, m, 0), "url")
    bo = ChunkStore(folder, m)
    assert bo.held() == [0] and bo.read(0) == chunk_of(model, m, 0)
    bo.accept(1, chunk_of(model, m, 1), "url")
    ada.accept(2, chunk_of(model, m, 2), "url")
    assert ada.held() == [0, 1, 2]  # bo's chunk, learnt when ada wrote its own
    for i in range(3, m.n_chunks):
        (ada if i % 2 else bo).accept(i, chunk_of(model, m, i), "url")
    assert ada.finish().read_bytes() == model.read_bytes()
    assert not bo.complete  # ada's last chunks are news to bo ...
    assert bo.finish() == ada.final and bo.complete  # ... until it finds the file finished
    assert bo.read(m.n_chunks - 1) == chunk_of(model, m, m.n_chunks - 1)

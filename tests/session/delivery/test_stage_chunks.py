"""A stage cut from a model holding only the chunks the stage needs: byte-identical to the cut from the whole file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.errors import SessionError
from kafila.model.cut import StageSpec, write_stage
from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.model_chunks import ChunkStore, UnverifiedRead, model_manifest
from kafila.session.delivery.stage_chunks import cut_and_check, cut_stage, header_wanted, read_header, stage_chunks
from kafila.session.delivery.stage_files import manifest_for
from tests.session.delivery.test_model_chunks import chunk_of

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 35 MB random-weight GGUF with 6 blocks of 5.9 MB."""
    return write_random_gguf(tmp_path_factory.mktemp("model") / "m.gguf", TEST_SHAPE, 6, tokenizer=False)


def sparse_stage_store(model: Path, spec: StageSpec, folder: Path) -> tuple[ChunkStore, list[int], int]:
    """A store holding only the header and `spec`'s chunks, its holes filled with noise (so a read of one would
    change the cut); also the stage's chunks and the rounds the header took."""
    manifest = model_manifest(folder, model)
    store = ChunkStore(folder / "store", manifest)
    rounds = 0
    while want := header_wanted(store):
        rounds += 1
        for i in want:
            store.accept(i, chunk_of(model, manifest, i), "host")
    header = read_header(store)
    assert header is not None
    needed = stage_chunks(header, manifest, spec)
    for i in store.missing(needed):
        store.accept(i, chunk_of(model, manifest, i), "url")
    noise = np.random.default_rng(0)
    with store.part.open("r+b") as f:
        for i in store.missing(range(manifest.n_chunks)):
            start, end = manifest.span(i)
            f.seek(start)
            f.write(noise.bytes(end - start))
    return store, needed, rounds


@pytest.mark.parametrize("which", ["random", "smollm2"])
def test_each_stage_cut_from_only_its_chunks_is_byte_identical(which: str, random_model: Path, smollm: Path,
                                                                tmp_path: Path) -> None:
    model = random_model if which == "random" else smollm
    n = read_header_blocks(model)
    for spec in (StageSpec(0, n // 3, False), StageSpec(n // 3, 2 * n // 3, False), StageSpec(2 * n // 3, n, True)):
        store, needed, _ = sparse_stage_store(model, spec, tmp_path / spec.tag)
        expected = write_stage(model, spec, tmp_path / f"{spec.tag}-whole.gguf")
        got = cut_and_check(store, spec, tmp_path / f"{spec.tag}-sparse.gguf", manifest_for(expected))
        assert got.read_bytes() == expected.read_bytes()
        assert len(needed) < store.manifest.n_chunks


def read_header_blocks(model: Path) -> int:
    from kafila.model.gguf_file import GGUFFile

    gf = GGUFFile(model)
    return int(gf.get(f"{gf.get('general.architecture')}.block_count"))


def test_a_middle_stage_needs_a_small_fraction_of_the_model(smollm: Path, tmp_path: Path) -> None:
    """SmolLM2 (98 MB, 30 blocks): the middle third of the blocks needs a third of the block bytes and the header."""
    store, needed, rounds = sparse_stage_store(smollm, StageSpec(10, 20, False), tmp_path)
    fraction = len(needed) / store.manifest.n_chunks
    print(f"middle stage of SmolLM2: {len(needed)} of {store.manifest.n_chunks} chunks ({fraction:.0%}), "
          f"header in {rounds} rounds")
    assert fraction < 0.30
    assert rounds >= 2  # SmolLM2's tokenizer makes a header larger than one chunk


def test_a_stage_missing_one_chunk_is_not_cut(random_model: Path, tmp_path: Path) -> None:
    spec = StageSpec(2, 4, False)
    store, needed, _ = sparse_stage_store(random_model, spec, tmp_path)
    manifest = store.manifest
    # a restart that finds one of the stage's chunks damaged: the store drops it, the cut refuses
    with store.part.open("r+b") as f:
        f.seek(manifest.span(needed[-1])[0])
        f.write(b"\x55" * 16)
    store = ChunkStore(store.folder, manifest)
    with pytest.raises(UnverifiedRead, match=rf"stage body-2-4 needs 1 chunks .*\[{needed[-1]}\]"):
        cut_stage(store, spec, tmp_path / "s.gguf")
    assert not (tmp_path / "s.gguf").exists()
    with pytest.raises(UnverifiedRead, match="header has not arrived"):
        cut_stage(ChunkStore(tmp_path / "empty", manifest), spec, tmp_path / "s.gguf")


def test_a_cut_unlike_the_hosts_stage_is_refused(random_model: Path, tmp_path: Path) -> None:
    spec = StageSpec(2, 4, False)
    store, _, _ = sparse_stage_store(random_model, spec, tmp_path)
    other = manifest_for(write_stage(random_model, StageSpec(1, 3, False), tmp_path / "other.gguf"))
    with pytest.raises(SessionError, match="cut from the model's verified chunks has sha256"):
        cut_and_check(store, spec, tmp_path / "s.gguf", other)
    assert not (tmp_path / "s.gguf").exists()

"""The model manifest's wire form: every field a member must not trust is checked, naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafila.errors import ProtocolError
from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.model_chunks import model_manifest
from kafila.session.protocol.model_manifest import MAX_CHUNKS, ModelManifest, ModelSource, chunk_size_for

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_gguf(tmp_path_factory.mktemp("model") / "m.gguf", TEST_SHAPE, 6, tokenizer=False)


def test_spans_and_covering_chunks(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    c = manifest.chunk_size
    assert manifest.span(0) == (0, c) and manifest.span(33) == (33 * c, manifest.size)
    assert list(manifest.covering(c - 1, c + 1)) == [0, 1] and list(manifest.covering(c, 2 * c)) == [1]
    assert list(manifest.covering(5, 5)) == [] and list(manifest.covering(0, manifest.size)) == list(range(34))


def test_the_manifest_wire_form_is_strict(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    assert ModelManifest.from_dict(manifest.as_dict()) == manifest
    bad = [
        ({"sha256": "A" * 64}, "sha256 must be 64 lowercase hex digits"),
        ({"size": True}, "size must be"),
        ({"size": manifest.size + manifest.chunk_size}, "need 35 chunk hashes"),
        ({"chunk_size": 4096}, "chunk_size must be"),
        ({"digests": manifest.as_dict()["digests"][:-4]}, "digests must be base64 of 32-byte"),
        ({"digests": "not base64!"}, "digests must be base64"),
    ]
    for change, why in bad:
        with pytest.raises(ProtocolError, match=f"model manifest is .*{why}"):
            ModelManifest.from_dict({**manifest.as_dict(), **change})
    with pytest.raises(ProtocolError, match="model manifest is malformed: not an object"):
        ModelManifest.from_dict([])


def test_a_large_model_gets_larger_chunks_so_its_manifest_fits_an_assignment() -> None:
    mib, gib = 1 << 20, 1 << 30
    assert chunk_size_for(1) == chunk_size_for(16 * gib) == mib
    assert chunk_size_for(16 * gib + 1) == 2 * mib and chunk_size_for(40 * 10**9) == 4 * mib
    assert chunk_size_for(1 << 40) == 64 * mib
    for size in (1, 16 * gib + 1, 40 * 10**9, 1 << 40):
        assert -(-size // chunk_size_for(size)) <= MAX_CHUNKS
    # the largest manifest's wire form, beside the 4 MiB a control message may hold
    big = ModelManifest("a" * 64, 1 << 40, 64 * mib, ("b" * 64,) * MAX_CHUNKS)
    assert len(json.dumps(big.as_dict())) < 800_000
    assert ModelManifest.from_dict(big.as_dict()) == big


def test_a_model_source_names_http_urls_only(model: Path, tmp_path: Path) -> None:
    manifest = model_manifest(tmp_path, model)
    source = ModelSource(manifest, ("https://huggingface.co/o/m/resolve/main/m.gguf", "http://127.0.0.1:8/m"))
    assert ModelSource.from_dict(source.as_dict()) == source
    for urls, why in (([], "1..8 URLs"), (["file:///etc/passwd"], "not an http"), (["https://"], "not an http"),
                      (["http://h/" + "x" * 3000], "at most 2048"), ([7], "must be a string")):
        with pytest.raises(ProtocolError, match=why):
            ModelSource.from_dict({**source.as_dict(), "urls": urls})

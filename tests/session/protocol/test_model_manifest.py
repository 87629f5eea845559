"""The model manifest's wire form: every field a member must not trust is checked, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.errors import ProtocolError
from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.model_chunks import model_manifest
from kafila.session.protocol.model_manifest import ModelManifest

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
        ({"chunks": [*manifest.chunks[:-1], "x"]}, "every chunk hash"),
    ]
    for change, why in bad:
        with pytest.raises(ProtocolError, match=f"model manifest is .*{why}"):
            ModelManifest.from_dict({**manifest.as_dict(), **change})
    with pytest.raises(ProtocolError, match="model manifest is malformed: not an object"):
        ModelManifest.from_dict([])

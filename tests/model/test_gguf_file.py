"""The GGUF reader agrees with the gguf package's reader, and refuses damaged files with a ModelError."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafila.errors import ModelError
from kafila.model.gguf_file import GGUFFile


def test_matches_reference_reader(synthetic_models: dict[str, Path]) -> None:
    path = synthetic_models["qwen3"]
    ours = GGUFFile(path)
    ref = gguf.GGUFReader(path)
    assert set(ours.fields) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key, field in ours.fields.items():
        assert field.value == ref.fields[key].contents(), key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.offset == t.data_offset and mine.n_bytes == t.n_bytes
        assert np.array_equal(ours.tensor_bytes(mine).view(np.uint8).ravel(), t.data.view(np.uint8).ravel())


def test_embedded_model_tensor_table(smollm: Path) -> None:
    ours = GGUFFile(smollm)
    ref = gguf.GGUFReader(smollm)
    assert [(t.name, t.data_offset, t.n_bytes) for t in ref.tensors] == [
        (t.name, t.offset, t.n_bytes) for t in ours.tensors.values()
    ]
    assert len(ours.get("tokenizer.ggml.tokens")) == 49152


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ModelError, match="not a GGUF file"):
        GGUFFile(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        GGUFFile(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [5, 30, 200, 2000, -1000, -1])
def test_truncated(synthetic_models: dict[str, Path], tmp_path: Path, keep: int) -> None:
    data = synthetic_models["llama"].read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep])
    with pytest.raises(ModelError, match=r"truncated|corrupt"):
        GGUFFile(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_damaged_header_is_model_error(synthetic_models: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    """Random byte damage in the header either still parses or gives a ModelError, never anything else."""
    raw = bytearray(synthetic_models["qwen2"].read_bytes())
    header_end = GGUFFile(synthetic_models["qwen2"]).data_start
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(4, header_end - 1))
        raw[i] = data.draw(st.integers(0, 255))
    p = tmp_path / "damaged.gguf"
    p.write_bytes(bytes(raw))
    try:
        GGUFFile(p)
    except ModelError:
        pass

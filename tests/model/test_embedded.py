"""`--model` takes a path or the name of a model a package ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.errors import ModelError
from kafila.model.describe import describe_model
from kafila.model.embedded import default_model_path, gemma3_model_path, resolve_model


def test_names_and_paths(smollm: Path, tmp_path: Path) -> None:
    assert resolve_model(None) == resolve_model("smollm2") == default_model_path()
    assert resolve_model(str(smollm)) == smollm
    with pytest.raises(ModelError, match=r"model file not found: .*gemma7 \(--model takes a GGUF path or one of: "
                                         r"smollm2, gemma3\)"):
        resolve_model(tmp_path / "gemma7")


def test_gemma3_assembled_into_the_cache(tmp_path: Path) -> None:
    path = gemma3_model_path(tmp_path)
    assert path.parent == tmp_path / "models"
    info = describe_model(path)
    assert (info.arch, info.n_blocks, info.n_embd) == ("gemma3", 18, 640)
    # llama.cpp's default pattern for Gemma 3: every sixth layer global
    assert [i for i, swa in enumerate(info.window_layers) if not swa] == [5, 11, 17]
    assert gemma3_model_path(tmp_path) == path  # the second call finds the verified copy


def test_damaged_gemma3_copy_is_assembled_again(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF, cut short by a full disk")
    assert describe_model(gemma3_model_path(tmp_path)).arch == "gemma3"

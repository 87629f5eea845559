"""The second build's place in the cache: keyed by version and flags, finished only with its marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kafila.engine.variant import env_for, is_built, variant_dir

pytestmark = pytest.mark.fast


def test_the_place_is_keyed_by_version_and_flags(tmp_path: Path) -> None:
    a = variant_dir("0.3.36", "-DGGML_NATIVE=ON", tmp_path)
    assert a == variant_dir("0.3.36", "-DGGML_NATIVE=ON", tmp_path)
    assert a != variant_dir("0.3.36", "-DGGML_CUDA=on", tmp_path)
    assert a != variant_dir("0.3.37", "-DGGML_NATIVE=ON", tmp_path)
    assert a.parent == tmp_path and a.name.startswith("llama-cpp-python-0.3.36-")


def test_the_default_place_is_the_user_cache_directory() -> None:
    import platformdirs

    assert variant_dir().parent == Path(platformdirs.user_cache_dir("kafila")) / "llama-builds"


def test_an_unfinished_build_does_not_count(tmp_path: Path) -> None:
    path = tmp_path / "v"
    (path / "llama_cpp").mkdir(parents=True)
    (path / "llama_cpp" / "__init__.py").write_text("")
    assert not is_built(path)  # an interrupted build left no marker
    (path / ".kafila-built").write_text("0.3.36\n-DGGML_NATIVE=ON\n")
    assert is_built(path)


def test_its_llama_cpp_comes_first_on_the_path(tmp_path: Path) -> None:
    env = env_for(tmp_path, {"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path), "/elsewhere"]) and env["HOME"] == "/h"
    assert env_for(tmp_path, {})["PYTHONPATH"] == str(tmp_path)

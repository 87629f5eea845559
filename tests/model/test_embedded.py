"""`--model` takes a path or the name of a model a package ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.engine.chain import open_chain
from kafila.engine.stage import ContextConfig
from kafila.errors import EngineError, ModelError
from kafila.model.describe import describe_model
from kafila.model.embedded import default_model_path, gemma3_model_path, resolve_model
from kafila.model.stage_cache import StageCache
from kafila.model.stores import StoreRoots

pytestmark = pytest.mark.fast


def test_names_and_paths(smollm: Path, tmp_path: Path) -> None:
    assert resolve_model(None) == resolve_model("smollm2") == default_model_path()
    assert resolve_model(str(smollm)) == smollm
    no_stores = StoreRoots(tmp_path / "ollama", tmp_path / "hf", (tmp_path / "lms",))
    with pytest.raises(ModelError, match=r"model not found: no file .*gemma7 and no model of that name "
                                         r"\(--model takes a GGUF path, one of: smollm2, gemma3, or a name "
                                         r"`kafila models` lists"):
        resolve_model(tmp_path / "gemma7", no_stores)


def test_a_file_in_the_current_directory_does_not_shadow_a_model_name(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 34 item 12: `./smollm2` (any file) was loaded for `--model smollm2`
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").write_bytes(b"not the embedded model")
    (tmp_path / "mine").write_bytes(b"GGUF")
    (tmp_path / "mine.gguf").write_bytes(b"")
    no_stores = StoreRoots(tmp_path / "ollama", tmp_path / "hf", (tmp_path / "lms",))
    assert resolve_model("smollm2", no_stores) == default_model_path()
    with pytest.raises(ModelError, match=r"'mine' is not a model name; .* give it as a path: --model ./mine"):
        resolve_model("mine", no_stores)
    assert resolve_model("./mine", no_stores) == Path("./mine")  # a path that looks like one is a path
    assert resolve_model("mine.gguf", no_stores) == Path("mine.gguf")


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



def test_gemma3_chat_says_how_to_complete_raw_text(tmp_path: Path) -> None:
    # Gemma 3 270M is a base model: no chat template. Asked to chat, it says what works instead.
    chain = open_chain(gemma3_model_path(tmp_path), "", ContextConfig(n_ctx_per_seq=64, n_seq_max=1),
                       StageCache(tmp_path))
    try:
        with pytest.raises(EngineError, match=r"no chat template .*complete raw text with `kafila generate"):
            chain.vocab.chat_tokens([{"role": "user", "content": "Hello"}])
    finally:
        chain.close()

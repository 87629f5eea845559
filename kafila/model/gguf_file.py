"""Opening GGUF files safely: a corrupt or truncated file is a ModelError, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from kafila.errors import ModelError

GGUF_MAGIC = b"GGUF"


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """A GGUFReader over `path`, after checking that header and every tensor's data are in the file."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"model file not found: {p}")
    size = p.stat().st_size
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{p.name} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = gguf.GGUFReader(p)
    except Exception as exc:  # the reader raises ValueError, struct/numpy errors, IndexError...
        raise ModelError(f"{p.name} is corrupt or truncated: the GGUF header could not be read ({exc})") from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelError(
                f"{p.name} is truncated: tensor {t.name} ends at byte {end} but the file has {size} bytes"
            )
    return reader


def field_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value as a Python value (str, int, float, bool or list), or `default`."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def require_field(reader: gguf.GGUFReader, key: str) -> Any:
    """A metadata value that must be present; its absence names the key."""
    value = field_value(reader, key)
    if value is None:
        raise ModelError(f"GGUF metadata key '{key}' is missing")
    return value

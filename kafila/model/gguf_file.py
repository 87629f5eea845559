"""A fast, validating GGUF reader: metadata and tensor table parsed from one memory map.

gguf.GGUFReader builds a numpy view per token of the vocabulary, which takes seconds for a
49k-token tokenizer; Kafila reads headers often (describe, cut, probe, embed), so it parses
the format itself (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv × (string key | u32 type | value)          string = u64 length + UTF-8 bytes
    n_tensors × (string name | u32 n_dims | n_dims × u64 ne | u32 ggml type | u64 offset)
    padding to `general.alignment` (default 32) | tensor data (offsets relative to here)

Any inconsistency (bad magic, a read past the end, a tensor outside the file) is a ModelError.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from kafila.errors import ModelError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class Field:
    """One metadata entry: its value, its GGUF type, and the element type of an array."""

    value: Any
    type: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's name, ggml shape (ne, fastest-varying first), type and absolute byte range."""

    name: str
    ne: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # absolute, in the file
    n_bytes: int

    def byte_shape(self) -> tuple[int, ...]:
        """numpy shape of the raw bytes: rows (outer dims, slowest first) × bytes per row."""
        block, size = GGML_QUANT_SIZES[self.type]
        return (*reversed(self.ne[1:]), self.ne[0] // block * size)


class _Cursor:
    def __init__(self, buf: mmap.mmap, name: str) -> None:
        self.buf, self.pos, self.name = buf, 0, name

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelError(f"{self.name} is truncated: the GGUF header ends early at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise ModelError(f"{self.name} is truncated: a string at byte {self.pos} runs past the end")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        raise ModelError(f"{self.name} is corrupt: unknown metadata value type {vtype} at byte {self.pos}")

    def array(self) -> tuple[GGUFValueType, list[Any]]:
        sub = self.unpack("<I")
        n = self.unpack("<Q")
        if sub in _SCALARS and sub != GGUFValueType.BOOL:
            dtype = np.dtype(_SCALARS[sub])
            end = self.pos + n * dtype.itemsize
            if end > len(self.buf):
                raise ModelError(f"{self.name} is truncated: an array at byte {self.pos} runs past the end")
            items = np.frombuffer(self.buf, dtype, n, self.pos).tolist()
            self.pos = end
        else:
            if n > len(self.buf):
                raise ModelError(f"{self.name} is corrupt: an array claims {n} items")
            items = [self.value(sub) for _ in range(n)]
        return GGUFValueType(sub), items


class GGUFFile:
    """A parsed GGUF: `fields` (metadata), `tensors` (by name, in file order) and raw tensor bytes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        with self.path.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise ModelError(f"{self.path.name} is not a GGUF file (it does not start with 'GGUF')")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.fields: dict[str, Field] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def _parse(self) -> None:
        cur = _Cursor(self._map, self.path.name)
        cur.pos = 4
        self.version = cur.unpack("<I")
        if self.version not in (2, 3):
            raise ModelError(f"{self.path.name}: GGUF version {self.version} is not supported (2 or 3 are)")
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.unpack("<I")
            if vtype == GGUFValueType.ARRAY:
                sub, items = cur.array()
                self.fields[key] = Field(items, GGUFValueType.ARRAY, sub)
            else:
                self.fields[key] = Field(cur.value(vtype), GGUFValueType(vtype))
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            if not 1 <= n_dims <= 4:
                raise ModelError(f"{self.path.name} is corrupt: tensor {name} has {n_dims} dimensions")
            ne = tuple(cur.unpack("<Q") for _ in range(n_dims))
            raw.append((name, ne, cur.unpack("<I"), cur.unpack("<Q")))
        align = int(self.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = (cur.pos + align - 1) // align * align
        size = len(self._map)
        for name, ne, ttype, rel in raw:
            try:
                qtype = GGMLQuantizationType(ttype)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelError(f"{self.path.name}: tensor {name} has unknown ggml type {ttype}") from None
            count = int(np.prod(ne))
            n_bytes = count // block * type_size
            start = self.data_start + rel
            if start + n_bytes > size:
                raise ModelError(
                    f"{self.path.name} is truncated: tensor {name} ends at byte {start + n_bytes} "
                    f"but the file has {size} bytes"
                )
            self.tensors[name] = TensorInfo(name, ne, qtype, start, n_bytes)

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, or `default` when absent."""
        field = self.fields.get(key)
        return default if field is None else field.value

    def require(self, key: str) -> Any:
        """A metadata value that must be present; its absence names the key."""
        if key not in self.fields:
            raise ModelError(f"{self.path.name}: GGUF metadata key '{key}' is missing")
        return self.fields[key].value

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """The tensor's raw bytes as a read-only uint8 array of `info.byte_shape()` (no copy)."""
        return np.frombuffer(self._map, np.uint8, info.n_bytes, info.offset).reshape(info.byte_shape())

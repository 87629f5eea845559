"""A fast, validating GGUF reader: metadata and tensor table parsed from one memory map.

gguf.GGUFReader builds a numpy view per token of the vocabulary, which takes seconds for a
49k-token tokenizer; Kafila reads headers often (describe, cut, probe, embed), so it parses
the format itself (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv × (string key | u32 type | value)          string = u64 length + UTF-8 bytes
    n_tensors × (string name | u32 n_dims | n_dims × u64 ne | u32 ggml type | u64 offset)
    padding to `general.alignment` (default 32) | tensor data (offsets relative to here)

Any inconsistency (bad magic, a read past the end, a tensor outside the file, an alignment that is
not a power of two, an unknown type) is a ModelError; sizes are Python integers, so a huge shape
cannot wrap around to a small one. Numeric arrays (a tokenizer's scores and token types) are kept
as read-only numpy arrays: as Python lists they took 8 times the memory.
"""

from __future__ import annotations

import math
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
MAX_HPARAM = 1 << 32  # counts and widths in the metadata are u32 in every model llama.cpp reads

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_INTEGERS = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
             GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}


@dataclass(frozen=True)
class Field:
    """One metadata entry: its value (a numeric array is a numpy array), its GGUF type, an array's element type."""

    value: Any
    type: GGUFValueType
    sub_type: GGUFValueType | None = None

    def plain(self) -> Any:
        """The value as plain Python objects (lists, not numpy arrays): what gguf's writer takes."""
        return self.value.tolist() if isinstance(self.value, np.ndarray) else self.value


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's name, ggml shape (ne, fastest-varying first), type and absolute byte range."""

    name: str
    ne: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # absolute, in the file
    n_bytes: int
    shard: int = 0  # which file of a split set holds it (gguf_set.GGUFSet); 0 in a single file

    def byte_shape(self) -> tuple[int, ...]:
        """numpy shape of the raw bytes: rows (outer dims, slowest first) × bytes per row."""
        block, size = GGML_QUANT_SIZES[self.type]
        return (*reversed(self.ne[1:]), self.ne[0] // block * size)


class HeaderIncomplete(ModelError):
    """The bytes given are the start of a longer file and end inside its GGUF header: more of them are needed."""


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, name: str, size: int) -> None:
        self.buf, self.pos, self.name = buf, 0, name
        self.partial = len(buf) < size  # `buf` is only the file's first bytes (GGUFFile.from_prefix)

    def past_end(self, message: str) -> ModelError:
        """The error for a read past `buf`: the file's own damage, or (a prefix) a need for more of its start."""
        if self.partial:
            return HeaderIncomplete(f"{self.name}: its first {len(self.buf)} bytes end inside the GGUF header")
        return ModelError(message)

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise self.past_end(f"{self.name} is truncated: the GGUF header ends early at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise self.past_end(f"{self.name} is truncated: a string at byte {self.pos} runs past the end")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        raise ModelError(f"{self.name} is corrupt: unknown metadata value type {vtype} at byte {self.pos}")

    def array(self) -> tuple[GGUFValueType, Any]:
        sub = self.unpack("<I")
        n = self.unpack("<Q")
        left = len(self.buf) - self.pos
        if sub == GGUFValueType.STRING:
            if n * 8 > left:  # every string takes at least its 8-byte length
                raise self.past_end(f"{self.name} is corrupt: an array at byte {self.pos} claims {n} strings")
            return GGUFValueType.STRING, [self.string() for _ in range(n)]
        if sub not in _SCALARS:
            what = "arrays of arrays are not supported" if sub == GGUFValueType.ARRAY else f"unknown element type {sub}"
            raise ModelError(f"{self.name} is corrupt: an array at byte {self.pos} has {what}")
        dtype = np.dtype(_SCALARS[sub].replace("?", "B"))  # bools as bytes: numpy's bool must be exactly 0 or 1
        if n * dtype.itemsize > left:
            raise self.past_end(f"{self.name} is truncated: an array at byte {self.pos} runs past the end")
        items = np.frombuffer(self.buf, dtype, n, self.pos)
        items = items != 0 if sub == GGUFValueType.BOOL else items.copy()  # a copy: the map may be closed
        items.flags.writeable = False
        self.pos += n * dtype.itemsize
        return GGUFValueType(sub), items


class Metadata:
    """Typed, validating access to a GGUF's metadata `fields`; errors name the file at `path`."""

    path: Path
    fields: dict[str, Field]

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, or `default` when absent."""
        field = self.fields.get(key)
        return default if field is None else field.value

    def require(self, key: str) -> Any:
        """A metadata value that must be present; its absence names the key."""
        if key not in self.fields:
            raise ModelError(f"{self.path.name}: GGUF metadata key '{key}' is missing")
        return self.fields[key].value

    def get_int(self, key: str, default: int | None = None, low: int = 0) -> int:
        """A whole-number hyper-parameter in [low, 2^32) (absent: `default`, or an error when there is none)."""
        field = self.fields.get(key)
        if field is None:
            if default is None:
                raise ModelError(f"{self.path.name}: GGUF metadata key '{key}' is missing")
            return default
        if field.type not in _INTEGERS or not low <= field.value < MAX_HPARAM:
            got = field.value if field.type in _INTEGERS else f"a value of type {field.type.name}"
            raise ModelError(f"{self.path.name}: GGUF metadata key '{key}' must be a whole number from {low}, "
                             f"got {got}")
        return int(field.value)

    def get_per_layer(self, key: str, n_layers: int, default: int) -> list[int]:
        """A hyper-parameter GGUF stores either once or once per layer, as one whole number per layer."""
        field = self.fields.get(key)
        if field is None or field.type != GGUFValueType.ARRAY:
            return [self.get_int(key, default)] * n_layers
        values = field.value
        if field.sub_type not in _INTEGERS or len(values) != n_layers or not all(0 <= v < MAX_HPARAM for v in values):
            raise ModelError(f"{self.path.name}: GGUF metadata key '{key}' must hold {n_layers} whole numbers, "
                             f"one per block")
        return [int(v) for v in values]


class GGUFFile(Metadata):
    """A parsed GGUF: `fields` (metadata), `tensors` (by name, in file order) and raw tensor bytes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        try:
            with self.path.open("rb") as f:
                if f.read(4) != GGUF_MAGIC:
                    raise ModelError(f"{self.path.name} is not a GGUF file (it does not start with 'GGUF')")
                self._map: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise ModelError(f"cannot read the model file {self.path}: {exc.strerror or exc}") from None
        self._size = len(self._map)
        self.fields: dict[str, Field] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    @classmethod
    def from_prefix(cls, name: str, prefix: bytes, size: int) -> GGUFFile:
        """The header of a `size`-byte GGUF parsed from its first bytes alone (a model arriving chunk by chunk);
        HeaderIncomplete when they end inside the header. Its tensor bytes are not readable."""
        if not prefix.startswith(GGUF_MAGIC):
            raise ModelError(f"{name} is not a GGUF file (it does not start with 'GGUF')")
        self = cls.__new__(cls)
        self.path, self._map, self._size = Path(name), prefix, size
        self.fields, self.tensors = {}, {}
        self._parse()
        return self

    def _parse(self) -> None:
        cur = _Cursor(self._map, self.path.name, self._size)
        cur.pos = 4
        self.version = cur.unpack("<I")
        if self.version not in (2, 3):
            raise ModelError(f"{self.path.name}: GGUF version {self.version} is not supported (2 or 3 are)")
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        for _ in range(n_kv):
            key = cur.string()
            if key in self.fields:
                raise ModelError(f"{self.path.name} is corrupt: metadata key '{key}' appears twice")
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
        align = self._alignment()
        self.data_start = (cur.pos + align - 1) // align * align
        for name, ne, ttype, rel in raw:
            if name in self.tensors:
                raise ModelError(f"{self.path.name} is corrupt: tensor {name} appears twice")
            self.tensors[name] = self._tensor(name, ne, ttype, rel, align)

    def _alignment(self) -> int:
        field = self.fields.get("general.alignment")
        if field is None:
            return DEFAULT_ALIGNMENT
        align = field.value
        if field.type not in _INTEGERS or align <= 0 or align & (align - 1):
            got = align if field.type in _INTEGERS else f"a value of type {field.type.name}"
            raise ModelError(f"{self.path.name} is corrupt: general.alignment must be a power of two, got {got}")
        return int(align)

    def _tensor(self, name: str, ne: tuple[int, ...], ttype: int, rel: int, align: int) -> TensorInfo:
        try:
            qtype = GGMLQuantizationType(ttype)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelError(f"{self.path.name}: tensor {name} has unknown ggml type {ttype}") from None
        if ne[0] % block:
            raise ModelError(f"{self.path.name} is corrupt: tensor {name}'s rows of {ne[0]} are not whole "
                             f"{qtype.name} blocks of {block}")
        if rel % align:
            raise ModelError(f"{self.path.name} is corrupt: tensor {name}'s offset {rel} is not a multiple of {align}")
        n_bytes = math.prod(ne) // block * type_size  # Python integers: a huge shape cannot wrap to a small size
        start = self.data_start + rel
        if start + n_bytes > self._size:
            raise ModelError(
                f"{self.path.name} is truncated: tensor {name} ends at byte {start + n_bytes} "
                f"but the file has {self._size} bytes"
            )
        return TensorInfo(name, ne, qtype, start, n_bytes)

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """The tensor's raw bytes as a read-only uint8 array of `info.byte_shape()` (no copy)."""
        return np.frombuffer(self._map, np.uint8, info.n_bytes, info.offset).reshape(info.byte_shape())

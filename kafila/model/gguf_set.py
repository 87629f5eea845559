"""A model as llama.cpp reads it: one GGUF, or a split set of them read as one.

llama.cpp's gguf-split layout (how most models over ~40 GB are published) names the files
`<prefix>-00001-of-00004.gguf` … `<prefix>-00004-of-00004.gguf`. Every file is a GGUF of its own
carrying three keys:

    split.no             u16  this file's index, from 0
    split.count          u16  how many files the set has
    split.tensors.count  i32  tensors in the whole set

The first file holds the model's metadata (and possibly tensors); the others hold only these keys
and their share of the tensors. As in llama.cpp, the first file is the one a user names, and the
others are found by name beside it. The set's metadata is the first file's without the split keys,
so a stage cut from a set is byte-identical to one cut from the same model in one file.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kafila.errors import ModelError
from kafila.model.gguf_file import GGUFFile, Metadata, TensorInfo

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = frozenset((SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS))
# llama.cpp's llama_split_path: "%s-%05d-of-%05d.gguf"
SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_name(prefix: str, no: int, count: int) -> str:
    """File name of shard `no` (from 0) of a set of `count`, as llama.cpp names it."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def is_later_shard(path: Path) -> bool:
    """True for a file named as the second or later file of a split set (listings show only the first)."""
    m = SHARD_NAME.match(path.name)
    return m is not None and int(m.group("no")) > 1


def set_paths(first: GGUFFile) -> list[Path]:
    """Every file of the set `first` begins (just `first` when it is not split), checked against its name."""
    count = first.get_int(SPLIT_COUNT, 0)
    no = first.get_int(SPLIT_NO, 0)
    if no != 0:
        m = SHARD_NAME.match(first.path.name)
        hint = f" ({shard_name(m.group('prefix'), 0, count)})" if m else ""
        raise ModelError(f"{first.path.name} is file {no + 1} of a split model of {count}: "
                         f"pass the first file{hint}")
    if count <= 1:
        return [first.path]
    m = SHARD_NAME.match(first.path.name)
    if not m or int(m.group("no")) != 1 or int(m.group("count")) != count:
        raise ModelError(f"{first.path.name} is the first file of a split model of {count}, but its name is not "
                         f"llama.cpp's '<name>-00001-of-{count:05d}.gguf', so the other files cannot be found")
    return [first.path.with_name(shard_name(m.group("prefix"), i, count)) for i in range(count)]


class GGUFSet(Metadata):
    """One model from one GGUF or a split set: the metadata of the first file, the tensors of all.

    `paths` lists the files in order; `tensors` keeps file order, each tagged with its file's index.
    """

    def __init__(self, path: str | Path) -> None:
        first = GGUFFile(path)
        self.path = first.path
        self.paths = set_paths(first)
        self.shards = [first]
        count = len(self.paths)
        self.fields = {k: v for k, v in first.fields.items() if k not in SPLIT_KEYS}
        self.tensors: dict[str, TensorInfo] = dict(first.tensors)
        if count == 1:
            return
        declared = first.get_int(SPLIT_TENSORS)
        arch = first.get("general.architecture")
        for i, shard_path in enumerate(self.paths[1:], start=1):
            if not shard_path.is_file():
                raise ModelError(f"{first.path.name} is the first file of a split model of {count}, "
                                 f"but file {i + 1}, {shard_path.name}, is missing")
            shard = GGUFFile(shard_path)
            self._check_shard(shard, i, count, declared, arch)
            self.shards.append(shard)
            for name, info in shard.tensors.items():
                if name in self.tensors:
                    where = self.paths[self.tensors[name].shard].name
                    raise ModelError(f"tensor {name} appears both in {where} and in {shard_path.name}: "
                                     f"they are not one split model")
                self.tensors[name] = TensorInfo(info.name, info.ne, info.type, info.offset, info.n_bytes, i)
        if len(self.tensors) != declared:
            raise ModelError(f"the split model {first.path.name} holds {len(self.tensors)} tensors in its {count} "
                             f"files but declares {declared} ({SPLIT_TENSORS})")

    @staticmethod
    def _check_shard(shard: GGUFFile, i: int, count: int, declared: int, arch: object) -> None:
        name = shard.path.name
        got_no, got_count = shard.get_int(SPLIT_NO, 0), shard.get_int(SPLIT_COUNT, 0)
        if (got_no, got_count) != (i, count):
            raise ModelError(f"{name} belongs to another split model: it says it is file {got_no + 1} of "
                             f"{got_count}, where file {i + 1} of {count} belongs")
        got_tensors = shard.get_int(SPLIT_TENSORS, 0)
        if got_tensors != declared:
            raise ModelError(f"{name} belongs to another split model: its set has {got_tensors} tensors "
                             f"({SPLIT_TENSORS}), the first file's has {declared}")
        other = shard.get("general.architecture")
        if other is not None and other != arch:
            raise ModelError(f"{name} belongs to another split model: its architecture is '{other}', "
                             f"the first file's is '{arch}'")

    @property
    def file_bytes(self) -> int:
        """Bytes of all the set's files."""
        return sum(p.stat().st_size for p in self.paths)

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """The tensor's raw bytes (no copy), from whichever file holds it."""
        return self.shards[info.shard].tensor_bytes(info)

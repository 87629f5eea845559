"""The GGUF reader agrees with the gguf package's reader, and refuses damaged files with a ModelError."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafila.errors import ModelError
from kafila.model.describe import describe_model
from kafila.model.gguf_file import GGUFFile
from tests.conftest import run_kafila

pytestmark = pytest.mark.fast


def test_matches_reference_reader(synthetic_models: dict[str, Path]) -> None:
    path = synthetic_models["qwen3"]
    ours = GGUFFile(path)
    ref = gguf.GGUFReader(path)
    assert set(ours.fields) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key, field in ours.fields.items():
        assert field.plain() == ref.fields[key].contents(), key
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


def check_accepted(path: Path) -> None:
    """What holds of every GGUF the reader accepts (the format as ggml's gguf.md documents it): each tensor lies
    whole in the file, after the aligned start of the data and at an aligned offset, its size that of its shape in
    its ggml type's blocks (the gguf package's table); where the gguf package's own reader reads the file too, both
    see the same metadata keys and tensors; and the model described is made of those tensors."""
    size = path.stat().st_size
    ours = GGUFFile(path)
    align = ours.get("general.alignment", 32)
    assert align > 0 and align & (align - 1) == 0 and ours.data_start % align == 0
    for t in ours.tensors.values():
        block, type_size = gguf.GGML_QUANT_SIZES[t.type]
        assert t.ne[0] % block == 0 and t.n_bytes == math.prod(t.ne) // block * type_size, t
        assert ours.data_start <= t.offset and (t.offset - ours.data_start) % align == 0, t
        assert t.offset + t.n_bytes <= size, t
    try:
        ref = gguf.GGUFReader(path)
    except Exception:  # the reference reader refuses what it refuses, in its own ways
        ref = None
    if ref is not None:
        assert set(ours.fields) == {k for k in ref.fields if not k.startswith("GGUF.")}
        assert [(t.name, t.offset, t.n_bytes) for t in ours.tensors.values()] == [
            (t.name, t.data_offset, t.n_bytes) for t in ref.tensors]
    info = describe_model(path)
    assert info.file_bytes == size and len(info.blocks_bytes) == info.n_blocks >= 1
    for i, nbytes in enumerate(info.blocks_bytes):
        assert nbytes == sum(t.n_bytes for t in ours.tensors.values() if t.name.startswith(f"blk.{i}.")) > 0
    assert info.n_embd >= 1 and info.n_head >= 1


def test_a_damaged_tensor_name_still_counts_in_its_block(synthetic_models: dict[str, Path], tmp_path: Path) -> None:
    """Found by the fuzz test below: a newline in a block tensor's name ('blk.2.\\nttn_k.weight') dropped its bytes
    from the block's size."""
    raw = synthetic_models["qwen2"].read_bytes()
    at = raw.index(b"blk.2.attn_k.weight") + len(b"blk.2.")
    p = tmp_path / "damaged.gguf"
    p.write_bytes(raw[:at] + b"\n" + raw[at + 1:])
    check_accepted(p)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_damaged_header_is_model_error(synthetic_models: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    """Random byte damage in the header either still describes a model, one that holds what a GGUF must, or gives
    a ModelError, nothing else."""
    raw = bytearray(synthetic_models["qwen2"].read_bytes())
    header_end = GGUFFile(synthetic_models["qwen2"]).data_start
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(4, header_end - 1))
        raw[i] = data.draw(st.integers(0, 255))
    p = tmp_path / "damaged.gguf"
    p.write_bytes(bytes(raw))
    try:
        describe_model(p)  # the parser, then what `kafila inspect` reads from it
    except ModelError:
        return
    check_accepted(p)


# -- crafted files: each damage the format allows gets its own one-line error ---------------------------------------

def _str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    """One metadata entry: key, value type, value bytes."""
    return _str(key) + struct.pack("<I", vtype) + payload


def u32(key: str, value: int) -> bytes:
    return kv(key, GGUFValueType.UINT32, struct.pack("<I", value))


def crafted(path: Path, kvs: list[bytes], tensors: list[tuple[str, tuple[int, ...], int, int]] = (),  # type: ignore[assignment]
            data: bytes = b"\0" * 64, pad_to: int = 32) -> Path:
    """A GGUF v3 file from raw parts: metadata entries, (name, ne, ggml type, offset) tensors, data."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    for name, ne, ttype, offset in tensors:
        head += _str(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ttype, offset)
    head += b"\0" * (-len(head) % pad_to)
    path.write_bytes(head + data)
    return path


F32, Q4_0 = int(GGMLQuantizationType.F32), int(GGMLQuantizationType.Q4_0)
DAMAGED: dict[str, tuple[list[bytes], list[tuple[str, tuple[int, ...], int, int]], str]] = {
    "alignment 0": ([u32("general.alignment", 0)], [], "general.alignment must be a power of two, got 0"),
    "alignment 48": ([u32("general.alignment", 48)], [], "general.alignment must be a power of two, got 48"),
    "alignment as text": ([kv("general.alignment", GGUFValueType.STRING, _str("32"))], [],
                          "must be a power of two, got a value of type STRING"),
    "empty array of an unknown type": ([kv("x", GGUFValueType.ARRAY, struct.pack("<IQ", 99, 0))], [],
                                       "unknown element type 99"),
    "array of arrays": ([kv("x", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.ARRAY, 1))], [],
                        "arrays of arrays are not supported"),
    "2^60 strings": ([kv("x", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.STRING, 1 << 60))], [],
                     "claims 1152921504606846976 strings"),
    "2^62 floats": ([kv("x", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.FLOAT32, 1 << 62))], [],
                    "an array at byte 49 runs past the end"),
    "a shape whose size wraps to 0 in 64 bits": ([], [("t", (1 << 33, 1 << 31), F32, 0)],
                                                 f"tensor t ends at byte {96 + (1 << 66)}"),
    "rows of partial blocks": ([], [("q", (33, 2), Q4_0, 0)], "rows of 33 are not whole Q4_0 blocks of 32"),
    "an unaligned offset": ([], [("t", (4,), F32, 4)], "tensor t's offset 4 is not a multiple of 32"),
    "a tensor twice": ([], [("t", (4,), F32, 0), ("t", (4,), F32, 32)], "tensor t appears twice"),
    "a key twice": ([u32("k", 1), u32("k", 2)], [], "metadata key 'k' appears twice"),
    "an unknown ggml type": ([], [("t", (4,), 1000, 0)], "tensor t has unknown ggml type 1000"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_crafted_damage_is_a_specific_model_error(tmp_path: Path, case: str) -> None:
    kvs, tensors, message = DAMAGED[case]
    with pytest.raises(ModelError, match=re.escape(message)):
        GGUFFile(crafted(tmp_path / "bad.gguf", kvs, tensors))


def test_a_well_formed_crafted_file_parses(tmp_path: Path) -> None:
    """The crafting helper itself is right: without damage, the same kind of file reads back."""
    gf = GGUFFile(crafted(tmp_path / "ok.gguf", [u32("general.alignment", 32)], [("t", (4, 2), F32, 0)]))
    assert gf.tensors["t"].n_bytes == 32 and gf.data_start == 128 and gf.get("general.alignment") == 32


@pytest.mark.parametrize("case", ["alignment 0", "empty array of an unknown type", "a shape whose size wraps to 0 in "
                                  "64 bits"])
def test_kafila_inspect_reports_damage_in_one_line(tmp_path: Path, case: str) -> None:
    kvs, tensors, message = DAMAGED[case]
    path = crafted(tmp_path / "bad.gguf", kvs, tensors)
    out = run_kafila("inspect", str(path), timeout=120)
    assert out.returncode == 1 and out.stderr.startswith("kafila: error: bad.gguf") and message in out.stderr, out
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_numeric_arrays_are_compact(smollm: Path) -> None:
    scores = GGUFFile(smollm).fields["tokenizer.ggml.token_type"]
    assert isinstance(scores.value, np.ndarray) and scores.value.dtype == np.int32 and len(scores.value) == 49152
    assert not scores.value.flags.writeable  # shared by every reader of the field
    assert scores.plain() == gguf.GGUFReader(smollm).fields["tokenizer.ggml.token_type"].contents()


ARCH = kv("general.architecture", GGUFValueType.STRING, _str("llama"))
LAYERS = [("blk.0.attn_q.weight", (4,), F32, 0), ("token_embd.weight", (4, 1), F32, 32),
          ("output_norm.weight", (4,), F32, 0)]


@pytest.mark.parametrize(("kvs", "message"), [
    ([kv("llama.block_count", GGUFValueType.STRING, _str("two"))],
     "'llama.block_count' must be a whole number from 1, got a value of type STRING"),
    ([u32("llama.block_count", 0)], "'llama.block_count' must be a whole number from 1, got 0"),
    ([kv("llama.block_count", GGUFValueType.UINT64, struct.pack("<Q", 1 << 40))],
     f"'llama.block_count' must be a whole number from 1, got {1 << 40}"),
    ([u32("llama.block_count", 1000)], "declares 1000 blocks but holds only 3 tensors"),
    ([u32("llama.block_count", 1), u32("llama.embedding_length", 4), u32("llama.attention.head_count", 0)],
     "'llama.attention.head_count' must be a whole number from 1, got 0"),
    ([u32("llama.block_count", 1), u32("llama.embedding_length", 4), u32("llama.attention.head_count", 1),
      kv("llama.attention.head_count_kv", GGUFValueType.ARRAY, struct.pack("<IQ2i", GGUFValueType.INT32, 2, 1, 1))],
     "'llama.attention.head_count_kv' must hold 1 whole numbers, one per block"),
])
def test_hyper_parameters_of_the_wrong_kind_are_a_model_error(tmp_path: Path, kvs: list[bytes], message: str) -> None:
    with pytest.raises(ModelError, match=re.escape(message)):
        describe_model(crafted(tmp_path / "bad.gguf", [ARCH, *kvs], LAYERS))


def test_hyper_parameters_once_or_per_layer(tmp_path: Path) -> None:
    per_layer = kv("x", GGUFValueType.ARRAY, struct.pack("<IQ3I", GGUFValueType.UINT32, 3, 2, 4, 8))
    gf = GGUFFile(crafted(tmp_path / "ok.gguf", [u32("once", 5), per_layer]))
    assert gf.get_per_layer("once", 3, 1) == [5, 5, 5] and gf.get_per_layer("x", 3, 1) == [2, 4, 8]
    assert gf.get_per_layer("absent", 2, 7) == [7, 7] and gf.get_int("absent", 9) == 9
    with pytest.raises(ModelError, match="'absent' is missing"):
        gf.get_int("absent")


def test_kafila_inspect_reports_a_zero_head_count_in_one_line(tmp_path: Path) -> None:
    kvs = [ARCH, u32("llama.block_count", 1), u32("llama.embedding_length", 4), u32("llama.attention.head_count", 0)]
    out = run_kafila("inspect", str(crafted(tmp_path / "bad.gguf", kvs, LAYERS)), timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out  # was a ZeroDivisionError's traceback
    assert out.stderr.startswith("kafila: error: bad.gguf: GGUF metadata key 'llama.attention.head_count'")


def test_a_header_parses_from_the_files_start_alone(smollm: Path) -> None:
    """A model arriving chunk by chunk: its header is read from its first bytes; too few ask for more."""
    from kafila.model.gguf_file import HeaderIncomplete

    whole = GGUFFile(smollm)
    size = smollm.stat().st_size
    with smollm.open("rb") as f:
        start = f.read(whole.data_start)
    header = GGUFFile.from_prefix("m", start, size)
    assert header.tensors == whole.tensors and header.data_start == whole.data_start
    assert header.get("tokenizer.ggml.tokens") == whole.get("tokenizer.ggml.tokens")
    with pytest.raises(HeaderIncomplete, match="its first 1048576 bytes end inside the GGUF header"):
        GGUFFile.from_prefix("m", start[: 1 << 20], size)
    # the whole file, cut short: damage, not a need for more
    with pytest.raises(ModelError, match=r"truncated|corrupt") as damaged:
        GGUFFile.from_prefix("m", start[: 1 << 20], 1 << 20)
    assert not isinstance(damaged.value, HeaderIncomplete)

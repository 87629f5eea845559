"""Split GGUF files (llama.cpp's gguf-split layout): a set reads as one model, and a stage cut from it is
byte-identical to the stage cut from the same model in one file."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from kafila.engine.chain import LocalChain, pack, parse_split
from kafila.engine.reference import ReferenceContext
from kafila.engine.request import Chunk
from kafila.engine.stage import ContextConfig
from kafila.errors import ModelError
from kafila.model.cut import StageSpec, write_stage
from kafila.model.describe import describe_model
from kafila.model.gguf_file import GGUFFile
from kafila.model.gguf_set import GGUFSet
from kafila.model.stage_cache import StageCache, sha256_file
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast


def copy_gguf(src: Path, dest: Path, split_max_tensors: int = 0, kv: dict[str, int] | None = None) -> list[Path]:
    """Rewrite `src` with gguf's writer, as gguf-split does when `split_max_tensors` is set; `kv` changes
    (or adds) integer keys of the copy. Returns the files written, the first first."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    gf = GGUFFile(src)  # a later file of a set has no architecture key: the writer always adds one
    writer = gguf.GGUFWriter(dest, str(gf.get("general.architecture", "llama")), split_max_tensors=split_max_tensors)
    if "general.alignment" in gf.fields:
        writer.data_alignment = int(gf.get("general.alignment"))
    changes = dict(kv or {})
    for name, field in gf.fields.items():
        if name == "general.architecture":
            continue
        if name in changes:
            writer.add_key_value(name, changes.pop(name), field.type)
        else:
            writer.add_key_value(name, field.plain(), field.type, sub_type=field.sub_type)
    for name, value in changes.items():
        writer.add_int32(name, value)
    for t in gf.tensors.values():
        writer.add_tensor(t.name, np.array(gf.tensor_bytes(t)), raw_dtype=t.type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(dest)


@pytest.fixture(scope="module")
def single_and_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A Llama 3.1-style random model (a global rope_freqs tensor) in one file, and split in three."""
    d = tmp_path_factory.mktemp("split")
    single = write_synthetic(d / "one.gguf", "llama3", n_blocks=4, seed=5, tied=False)
    n_tensors = len(GGUFFile(single).tensors)
    shards = copy_gguf(single, d / "set" / "model.gguf", split_max_tensors=n_tensors // 3 + 1)
    assert [p.name for p in shards] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return single, shards


SPECS = [StageSpec(0, 2, False), StageSpec(2, 4, True), StageSpec(1, 3, False), StageSpec(0, 4, True)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.tag)
def test_stage_from_set_identical_to_stage_from_one_file(single_and_set: tuple[Path, list[Path]], tmp_path: Path,
                                                         spec: StageSpec) -> None:
    single, shards = single_and_set
    assert all(GGUFFile(p).tensors for p in shards)  # the tensors really are spread over the files
    a = write_stage(single, spec, tmp_path / "from-one.gguf").read_bytes()
    b = write_stage(shards[0], spec, tmp_path / "from-set.gguf").read_bytes()
    assert a == b


def test_set_describes_as_the_model(single_and_set: tuple[Path, list[Path]]) -> None:
    single, shards = single_and_set
    one, split = describe_model(single).as_dict(), describe_model(shards[0]).as_dict()
    assert split.pop("file_bytes") == sum(p.stat().st_size for p in shards)
    one.pop("file_bytes")
    assert split == one
    assert "split.count" not in GGUFSet(shards[0]).fields


def test_llama_cpp_reads_the_set_and_the_stages_cut_from_it(single_and_set: tuple[Path, list[Path]],
                                                            tmp_path: Path) -> None:
    """llama.cpp loads the set itself (so the test's set is a real gguf-split layout), and a chain of stages
    cut from the set gives logits identical to llama.cpp on the single file."""
    single, shards = single_and_set
    config = ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=32)
    tokens, rows = pack([Chunk(0, [1, 5, 9, 2, 30, 7, 3], 0, True)])
    ref = ReferenceContext(single, config)
    on_set = ReferenceContext(shards[0], config)
    chain = LocalChain(shards[0], parse_split("2", 4), config, StageCache(tmp_path / "cache"))
    try:
        want = ref.run(tokens, rows)
        assert np.array_equal(on_set.run(tokens, rows), want)
        assert np.array_equal(chain.forward(tokens, rows), want)
    finally:
        chain.close()
        on_set.close()
        ref.close()


def test_embedded_model_split_in_four(smollm: Path, tmp_path: Path) -> None:
    shards = copy_gguf(smollm, tmp_path / "smol.gguf", split_max_tensors=80)
    assert len(shards) == 4
    for spec in (StageSpec(5, 15, False), StageSpec(22, 30, True)):
        a = write_stage(smollm, spec, tmp_path / "a.gguf").read_bytes()
        b = write_stage(shards[0], spec, tmp_path / "b.gguf").read_bytes()
        assert a == b, spec


def test_stage_cache_hashes_every_file_of_a_set(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _, shards = single_and_set
    assert StageCache(tmp_path).source_hash(shards[0]) == sha256_file(shards[0], more=shards[1:])


def _set_copy(shards: list[Path], dest: Path) -> list[Path]:
    dest.mkdir()
    out = []
    for p in shards:
        (dest / p.name).write_bytes(p.read_bytes())
        out.append(dest / p.name)
    return out


def test_missing_file(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    shards = _set_copy(single_and_set[1], tmp_path / "s")
    shards[2].unlink()
    with pytest.raises(ModelError, match=r"model-00001-of-00003.gguf is the first file of a split model of 3, "
                                         r"but file 3, model-00003-of-00003.gguf, is missing"):
        write_stage(shards[0], StageSpec(0, 2, False), tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_a_later_file_is_not_the_model(single_and_set: tuple[Path, list[Path]]) -> None:
    with pytest.raises(ModelError, match=r"model-00002-of-00003.gguf is file 2 of a split model of 3: "
                                         r"pass the first file \(model-00001-of-00003.gguf\)"):
        describe_model(single_and_set[1][1])


def test_file_from_another_set(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """A second file from a set of another model (six blocks, also in three files) in the place of this one's."""
    other = write_synthetic(tmp_path / "other.gguf", "llama", n_blocks=6, seed=9)
    other_shards = copy_gguf(other, tmp_path / "o" / "model.gguf", split_max_tensors=20)
    assert len(other_shards) == 3
    shards = _set_copy(single_and_set[1], tmp_path / "s")
    shards[1].write_bytes(other_shards[1].read_bytes())
    with pytest.raises(ModelError, match=r"model-00002-of-00003.gguf belongs to another split model: its set has "
                                         r"\d+ tensors \(split.tensors.count\), the first file's has \d+"):
        describe_model(shards[0])


def test_file_that_says_it_is_another_index(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    shards = _set_copy(single_and_set[1], tmp_path / "s")
    copy_gguf(single_and_set[1][1], shards[1], kv={"split.no": 2})  # from the fixture's file: never onto itself
    with pytest.raises(ModelError, match=r"model-00002-of-00003\.gguf belongs to another split model: it says it is "
                                         r"file 3 of 3, where file 2 of 3 belongs"):
        describe_model(shards[0])


def test_wrong_tensor_count(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    shards = _set_copy(single_and_set[1], tmp_path / "s")
    n = GGUFFile(shards[0]).get_int("split.tensors.count")
    for original, p in zip(single_and_set[1], shards, strict=True):
        copy_gguf(original, p, kv={"split.tensors.count": n + 1})
    with pytest.raises(ModelError, match=rf"holds {n} tensors in its 3 files but declares {n + 1}"):
        describe_model(shards[0])


def test_first_file_not_named_as_llama_cpp_names_it(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    renamed = tmp_path / "model.gguf"
    renamed.write_bytes(single_and_set[1][0].read_bytes())
    with pytest.raises(ModelError, match=r"name is not llama\.cpp's '<name>-00001-of-00003\.gguf', so the other files "
                                         r"cannot be found"):
        describe_model(renamed)


def test_duplicate_tensor_across_files(single_and_set: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """A set whose second file repeats a tensor of the first (and so lacks one): the names say it is no one model."""
    shards = _set_copy(single_and_set[1], tmp_path / "s")
    first = GGUFFile(shards[0])
    name = next(iter(first.tensors))
    src = GGUFFile(single_and_set[1][1])
    writer = gguf.GGUFWriter(shards[1], "llama")
    for key in ("split.no", "split.count", "split.tensors.count"):
        writer.add_key_value(key, src.get(key), src.fields[key].type)
    dup = first.tensors[name]
    writer.add_tensor(dup.name, np.array(first.tensor_bytes(dup)), raw_dtype=dup.type)
    for t in list(src.tensors.values())[1:]:
        writer.add_tensor(t.name, np.array(src.tensor_bytes(t)), raw_dtype=t.type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match=rf"tensor {name} appears both in model-00001-of-00003.gguf and in "
                                         r"model-00002-of-00003.gguf"):
        describe_model(shards[0])

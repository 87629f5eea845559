"""Models by name from the stores of Ollama, the Hugging Face cache and LM Studio, laid out in a temporary
HOME as those tools lay them out, holding small real GGUF files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kafila.errors import ModelError
from kafila.model.cut import StageSpec, write_stage
from kafila.model.describe import assess_model
from kafila.model.embedded import resolve_model
from kafila.model.stores import StoreRoots, find_model, list_models
from kafila.session.coordinator.planning import model_label
from tests.conftest import run_kafila
from tests.model.test_refused import KINDS, write_kind
from tests.model.test_split_files import copy_gguf
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast

# Every store variable unset, so a test's stores are only the ones it lays out.
NO_OVERRIDES = {k: "" for k in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME",
                                "XDG_CACHE_HOME")}
REV = "0123456789abcdef0123456789abcdef01234567"


def ollama_pull(models: Path, gguf_file: Path, name: str, tag: str, namespace: str = "library",
                host: str = "registry.ollama.ai") -> Path:
    """Put `gguf_file` in an Ollama store as `ollama pull` leaves it: a blob named by digest and a manifest."""
    data = gguf_file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    blob = models / "blobs" / f"sha256-{digest}"
    blob.write_bytes(data)
    config = hashlib.sha256(name.encode()).hexdigest()
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": f"sha256:{config}",
                   "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
            {"mediaType": "application/vnd.ollama.image.template", "digest": f"sha256:{config}", "size": 2},
        ],
    }
    path = models / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def hf_download(hub: Path, repo_id: str, files: dict[str, Path], revision: str = REV) -> Path:
    """Put files in a Hugging Face cache as huggingface_hub does: blobs by hash, snapshot links, refs/main."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    for rel, src in files.items():
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    tiny = write_synthetic(src / "tiny.gguf", "llama", seed=1)
    tiny8 = write_synthetic(src / "tiny8.gguf", "qwen3", seed=2)
    keys, tensors, _ = KINDS["mamba"]
    mamba = write_kind(src / "mamba.gguf", "mamba", keys, tensors)
    projector = write_kind(src / "mmproj.gguf", "clip", {}, ["attn_q"], general_type="mmproj")
    big = copy_gguf(write_synthetic(src / "big.gguf", "qwen2", seed=3, n_blocks=4), src / "set" / "big.gguf",
                    split_max_tensors=30)
    home = tmp_path_factory.mktemp("home")
    ollama = home / ".ollama" / "models"
    ollama_pull(ollama, tiny, "tiny", "latest")
    ollama_pull(ollama, tiny8, "tiny", "q8")
    ollama_pull(ollama, mamba, "mamba-ish", "latest", namespace="someone")
    ollama_pull(ollama, tiny, "tiny-gguf", "Q4_K_M", namespace="org", host="hf.co")
    hub = home / ".cache" / "huggingface" / "hub"
    hf_download(hub, "org/Tiny-GGUF", {"tiny-q8.gguf": tiny8, "tiny-f32.gguf": tiny})
    hf_download(hub, "org/Big-GGUF", {f"F32/{p.name}": p for p in big})
    hf_download(hub, "org/Old-GGUF", {"old.gguf": tiny}, revision="f" * 40)
    (hub / "models--org--Old-GGUF" / "refs" / "main").write_text("e" * 40)  # main moved on; only f… is here
    lms = home / ".lmstudio" / "models" / "pub" / "Tiny-GGUF"
    lms.mkdir(parents=True)
    (lms / "tiny.gguf").write_bytes(tiny.read_bytes())
    (lms / "mmproj-tiny.gguf").write_bytes(projector.read_bytes())
    return home


def test_stores_listed_as_their_tools_lay_them_out(home: Path) -> None:
    models = {m.name: m for m in list_models(StoreRoots.from_env({"HOME": str(home), **NO_OVERRIDES}))}
    assert {name: m.source for name, m in models.items()} == {
        "tiny:latest": "ollama", "tiny:q8": "ollama", "someone/mamba-ish:latest": "ollama",
        "hf.co/org/tiny-gguf:Q4_K_M": "ollama",
        "org/Big-GGUF/F32/big-00001-of-00002.gguf": "huggingface",  # the first file of the set only
        "org/Old-GGUF/old.gguf": "huggingface",
        "org/Tiny-GGUF/tiny-f32.gguf": "huggingface", "org/Tiny-GGUF/tiny-q8.gguf": "huggingface",
        "pub/Tiny-GGUF/mmproj-tiny.gguf": "lmstudio", "pub/Tiny-GGUF/tiny.gguf": "lmstudio",
    }
    assert models["tiny:latest"].path.parent == home / ".ollama" / "models" / "blobs"
    hf = models["org/Tiny-GGUF/tiny-q8.gguf"].path
    assert hf.is_symlink() and hf.parent.name == REV


def test_env_overrides(home: Path, tmp_path: Path) -> None:
    """OLLAMA_MODELS and HF_HUB_CACHE (else HF_HOME/hub) move the stores; HOME still finds LM Studio's."""
    src = write_synthetic(tmp_path / "m.gguf", "llama", seed=4)
    ollama_pull(tmp_path / "ollama", src, "moved", "latest")
    hf_download(tmp_path / "hub", "org/Moved-GGUF", {"moved.gguf": src})
    hf_download(tmp_path / "hf-home" / "hub", "org/Home-GGUF", {"home.gguf": src})
    env = {"HOME": str(home), **NO_OVERRIDES, "OLLAMA_MODELS": str(tmp_path / "ollama")}
    names = {m.name for m in list_models(StoreRoots.from_env({**env, "HF_HUB_CACHE": str(tmp_path / "hub")}))}
    assert names == {"moved:latest", "org/Moved-GGUF/moved.gguf", "pub/Tiny-GGUF/mmproj-tiny.gguf",
                     "pub/Tiny-GGUF/tiny.gguf"}
    names = {m.name for m in list_models(StoreRoots.from_env({**env, "HF_HOME": str(tmp_path / "hf-home")}))}
    assert "org/Home-GGUF/home.gguf" in names


@pytest.mark.parametrize(("name", "want"), [
    ("tiny", "tiny:latest"),  # as in Ollama: no tag means :latest
    ("tiny:q8", "tiny:q8"),
    ("TINY:Q8", "tiny:q8"),
    ("mamba-ish", "someone/mamba-ish:latest"),
    ("org/Tiny-GGUF/tiny-q8.gguf", "org/Tiny-GGUF/tiny-q8.gguf"),
    ("tiny-q8", "org/Tiny-GGUF/tiny-q8.gguf"),
    ("org/Big-GGUF", "org/Big-GGUF/F32/big-00001-of-00002.gguf"),
    ("big", "org/Big-GGUF/F32/big-00001-of-00002.gguf"),
    ("pub/Tiny-GGUF/tiny.gguf", "pub/Tiny-GGUF/tiny.gguf"),
])
def test_found_by_name(home: Path, name: str, want: str) -> None:
    found = find_model(name, list_models(StoreRoots.from_env({"HOME": str(home), **NO_OVERRIDES})))
    assert found is not None and found.name == want


@pytest.mark.parametrize(("name", "candidates"), [
    ("Tiny-GGUF", ["org/Tiny-GGUF/tiny-f32.gguf (huggingface)", "org/Tiny-GGUF/tiny-q8.gguf (huggingface)",
                   "pub/Tiny-GGUF/mmproj-tiny.gguf (lmstudio)", "pub/Tiny-GGUF/tiny.gguf (lmstudio)",
                   "hf.co/org/tiny-gguf:Q4_K_M (ollama)"]),  # names match whatever their case
    ("org/Tiny-GGUF", ["org/Tiny-GGUF/tiny-f32.gguf (huggingface)", "org/Tiny-GGUF/tiny-q8.gguf (huggingface)"]),
])
def test_ambiguous_name_lists_candidates(home: Path, name: str, candidates: list[str]) -> None:
    roots = StoreRoots.from_env({"HOME": str(home), **NO_OVERRIDES})
    with pytest.raises(ModelError, match=f"the model name '{name}' is ambiguous: it could be ") as err:
        resolve_model(name, roots)
    assert str(err.value).split("could be ")[1] == "; ".join(candidates) + ". Use one of these names"


def test_stage_cut_from_a_split_set_in_the_hf_cache(home: Path, tmp_path: Path) -> None:
    """The set's files are links named in the snapshot (their blobs are named by hash): found by name there."""
    path = resolve_model("org/Big-GGUF", StoreRoots.from_env({"HOME": str(home), **NO_OVERRIDES}))
    original = _src(home, "big.gguf")
    a = write_stage(path, StageSpec(1, 3, False), tmp_path / "a.gguf").read_bytes()
    b = write_stage(original, StageSpec(1, 3, False), tmp_path / "b.gguf").read_bytes()
    assert a == b


def _src(home: Path, name: str) -> Path:
    return next(p for p in home.parent.glob(f"src*/{name}"))


def test_store_problems_are_named(home: Path, tmp_path: Path) -> None:
    models = tmp_path / "ollama"
    blob = ollama_pull(models, _src(home, "tiny.gguf"), "gone", "latest")
    blob.unlink()
    broken = models / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    evil = models / "manifests" / "registry.ollama.ai" / "library" / "evil" / "latest"
    evil.parent.mkdir(parents=True)
    evil.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                            "digest": "sha256:../../../etc/passwd"}]}))
    roots = StoreRoots(models, tmp_path / "hub", ())
    listed = {m.name: m.problem for m in list_models(roots)}
    assert listed["gone:latest"].startswith("its model blob sha256-") and "is missing" in listed["gone:latest"]
    assert listed["broken:latest"] == "its manifest is not readable JSON with layers"
    assert "is not sha256:<hex>" in listed["evil:latest"]
    with pytest.raises(ModelError, match=r"the model 'gone:latest' \(ollama\) cannot be used: its model blob"):
        resolve_model("gone", roots)


def test_models_command(home: Path, tmp_path: Path) -> None:
    out = run_kafila("models", "--json", env={"HOME": str(home), **NO_OVERRIDES,
                                              "KAFILA_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout) if r["source"] != "embedded"}
    tiny = rows["tiny:latest"]
    assert (tiny["arch"], tiny["quant"], tiny["splittable"]) == ("llama", "ALL_F32", True)
    assert tiny["bytes"] == _src(home, "tiny.gguf").stat().st_size
    big = rows["org/Big-GGUF/F32/big-00001-of-00002.gguf"]
    assert (big["arch"], big["splittable"]) == ("qwen2", True)
    assert big["bytes"] == sum(p.stat().st_size for p in _src(home, "set").glob("*.gguf"))
    mamba = rows["someone/mamba-ish:latest"]
    assert (mamba["arch"], mamba["splittable"]) == ("mamba", False)
    assert mamba["reason"].startswith("architecture 'mamba' cannot be split: a recurrent model")
    projector = rows["pub/Tiny-GGUF/mmproj-tiny.gguf"]
    assert not projector["splittable"] and "multimodal projector file (mmproj)" in projector["reason"]
    table = run_kafila("models", env={"HOME": str(home), **NO_OVERRIDES, "COLUMNS": "200"})
    assert table.returncode == 0 and "tiny:q8" in table.stdout and "recurrent model" in table.stdout


def test_model_by_name_on_the_command_line(home: Path) -> None:
    out = run_kafila("inspect", "tiny:q8", "--json", env={"HOME": str(home), **NO_OVERRIDES})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["arch"] == "qwen3"
    out = run_kafila("inspect", "Tiny-GGUF", env={"HOME": str(home), **NO_OVERRIDES})
    assert out.returncode == 1 and "is ambiguous" in out.stderr


def test_session_label_of_a_stored_model(home: Path) -> None:
    roots = StoreRoots.from_env({"HOME": str(home), **NO_OVERRIDES})
    assert model_label(resolve_model("tiny:q8", roots)) == "synthetic-qwen3"  # a blob's name is its digest
    assert model_label(resolve_model("org/Big-GGUF", roots)) == "big"


def test_assessment_of_a_model_that_runs_only_whole(tmp_path: Path) -> None:
    """Gemma 3 27B's block count: llama.cpp picks its attention scale by it, so no cut in two is possible."""
    whole = assess_model(write_synthetic(tmp_path / "g.gguf", "gemma3", n_blocks=62))
    assert (whole.arch, whole.quant) == ("gemma3", "ALL_F32")
    assert whole.problem.startswith("gemma3 with 62 blocks cannot be cut")
    assert assess_model(write_synthetic(tmp_path / "g8.gguf", "gemma3", n_blocks=8)).problem == ""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\0\0\0")
    assert "truncated" in assess_model(broken).problem

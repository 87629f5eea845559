"""Models already on the machine, found where the tools that downloaded them keep them.

Three stores, laid out as their tools lay them out:

- **Ollama** (`$OLLAMA_MODELS`, default `~/.ollama/models`): a manifest per model at
  `manifests/<host>/<namespace>/<model>/<tag>`, JSON whose `layers` hold one with mediaType
  `application/vnd.ollama.image.model` and digest `sha256:<hex>`; that layer is the GGUF at
  `blobs/sha256-<hex>`. Named as Ollama names it: `qwen3:8b` (`library` models), `ns/model:tag`,
  `host/ns/model:tag`; a name without a tag means `:latest`, as in Ollama.
- **Hugging Face cache** (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, default `~/.cache/huggingface/hub`):
  `models--<org>--<repo>/snapshots/<revision>/…/*.gguf`, links into `blobs/`. The revision `refs/main`
  names is used (else the newest snapshot). Named `org/repo/file.gguf`.
- **LM Studio** (`~/.lmstudio/models`, or the older `~/.cache/lm-studio/models`):
  `<publisher>/<repo>/*.gguf`. Named `publisher/repo/file.gguf`.

Of a split set (gguf_set.py) only the first file is listed. Besides its full name a model answers to
shorter ones (`org/repo`, the file name with or without `.gguf`, an Ollama model without its tag);
a short name several models answer to is ambiguous, and `find_model` says which models it could be.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kafila.errors import ModelError
from kafila.model.gguf_set import SHARD_NAME, is_later_shard

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY, OLLAMA_LIBRARY = "registry.ollama.ai", "library"
MAX_MANIFEST_BYTES = 1 << 20  # manifests are a few hundred bytes; anything far bigger is not one
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class StoredModel:
    """A GGUF some tool keeps: the name `--model` takes, where it came from, the file (first of a set)."""

    name: str
    source: str  # "ollama", "huggingface" or "lmstudio"
    path: Path
    # Names that mean this model as surely as `name` (Ollama's `model` for `model:latest`)...
    exact: tuple[str, ...] = ()
    # ...and shorter ones that may mean others too.
    short: tuple[str, ...] = ()
    problem: str = ""  # why the store's entry cannot be used (a missing blob), or ""


@dataclass(frozen=True)
class StoreRoots:
    """Where each store lives on this machine."""

    ollama: Path
    huggingface: Path
    lmstudio: tuple[Path, ...]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StoreRoots:
        """The stores' folders as their tools find them: environment overrides, else under HOME."""
        env = os.environ if env is None else env
        home = Path(env["HOME"]) if env.get("HOME") else Path.home()
        ollama = Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"
        if env.get("HF_HUB_CACHE"):
            hf = Path(env["HF_HUB_CACHE"])
        elif env.get("HUGGINGFACE_HUB_CACHE"):  # the older name huggingface_hub still honours
            hf = Path(env["HUGGINGFACE_HUB_CACHE"])
        elif env.get("HF_HOME"):
            hf = Path(env["HF_HOME"]) / "hub"
        else:
            cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
            hf = cache / "huggingface" / "hub"
        lms = (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models")
        return cls(ollama.expanduser(), hf.expanduser(), tuple(p.expanduser() for p in lms))


def list_models(roots: StoreRoots) -> list[StoredModel]:
    """Every model in the three stores, by store, then name."""
    found = [*_ollama(roots.ollama), *_huggingface(roots.huggingface)]
    for root in roots.lmstudio:
        found += _lmstudio(root)
    return found


def find_model(name: str, models: list[StoredModel]) -> StoredModel | None:
    """The one model `name` means (None when none does); a ModelError listing them when it could be several."""
    want = name.casefold()
    for names in (lambda m: (m.name,), lambda m: m.exact, lambda m: m.short):
        hits = list({m.path: m for m in models if want in (n.casefold() for n in names(m))}.values())
        if len(hits) == 1:
            if hits[0].problem:
                raise ModelError(f"the model '{hits[0].name}' ({hits[0].source}) cannot be used: {hits[0].problem}")
            return hits[0]
        if hits:
            listed = "; ".join(f"{m.name} ({m.source})" for m in sorted(hits, key=lambda m: (m.source, m.name)))
            raise ModelError(f"the model name '{name}' is ambiguous: it could be {listed}. Use one of these names")
    return None


def _gguf_names(rel: Path) -> tuple[str, ...]:
    """Short names of a GGUF at `rel` in a repository: its file name with and without .gguf (and the shard suffix)."""
    names = [rel.name, rel.stem]
    m = SHARD_NAME.match(rel.name)
    if m:
        names.append(m.group("prefix"))
    return tuple(names)


def _ggufs(folder: Path) -> Iterator[Path]:
    """GGUF files under `folder` (following links), except the later files of split sets."""
    for path in sorted(folder.rglob("*.gguf")):
        if not is_later_shard(path):
            yield path


def _ollama(root: Path) -> list[StoredModel]:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return []
    out = []
    for manifest in sorted(manifests.glob("*/*/*/*")):
        if not manifest.is_file():
            continue
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        name = f"{model}:{tag}"
        if namespace != OLLAMA_LIBRARY or host != OLLAMA_REGISTRY:
            name = f"{namespace}/{name}" if host == OLLAMA_REGISTRY else f"{host}/{namespace}/{name}"
        base = name.rsplit(":", 1)[0]
        blob, problem = _ollama_blob(root, manifest)
        out.append(StoredModel(name, "ollama", blob, exact=(base,) if tag == "latest" else (), short=(base, model),
                               problem=problem))
    return out


def _ollama_blob(root: Path, manifest: Path) -> tuple[Path, str]:
    """The model blob a manifest points at, and why it cannot be used ("" when it can)."""
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return manifest, "its manifest is too big to be one"
        doc = json.loads(manifest.read_text())
        layers = doc["layers"] if isinstance(doc, dict) else None
        if not isinstance(layers, list):
            raise ValueError("no layers")
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return manifest, "its manifest is not readable JSON with layers"
    for layer in layers:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            m = _DIGEST.match(str(layer.get("digest", "")))
            if not m:  # the digest becomes a file name: only the exact form, never a path
                return manifest, f"its model layer's digest {str(layer.get('digest'))[:80]!r} is not sha256:<hex>"
            blob = root / "blobs" / f"sha256-{m.group(1)}"
            return blob, "" if blob.is_file() else f"its model blob {blob.name} is missing (pull it again)"
    return manifest, "its manifest has no model layer"


def _huggingface(root: Path) -> list[StoredModel]:
    if not root.is_dir():
        return []
    out = []
    for repo_dir in sorted(root.glob("models--*")):
        parts = repo_dir.name.removeprefix("models--").split("--")
        repo_id = "/".join(parts)
        snapshot = _hf_snapshot(repo_dir)
        if snapshot is None:
            continue
        for path in _ggufs(snapshot):
            rel = path.relative_to(snapshot)
            problem = "" if path.is_file() else "its download is incomplete (the link's blob is missing)"
            out.append(StoredModel(f"{repo_id}/{rel.as_posix()}", "huggingface", path,
                                   short=(repo_id, parts[-1], *_gguf_names(rel)), problem=problem))
    return out


def _hf_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot refs/main names, else the newest one."""
    try:
        main = (repo_dir / "refs" / "main").read_text().strip()
    except (OSError, UnicodeDecodeError):
        main = ""
    snapshots = repo_dir / "snapshots"
    if main and "/" not in main and (snapshots / main).is_dir():
        return snapshots / main
    revisions = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    return max(revisions, key=lambda p: p.stat().st_mtime, default=None)


def _lmstudio(root: Path) -> list[StoredModel]:
    if not root.is_dir():
        return []
    out = []
    for path in _ggufs(root):
        rel = path.relative_to(root)
        if len(rel.parts) < 3:  # LM Studio keeps <publisher>/<repo>/<file>
            continue
        repo = "/".join(rel.parts[:2])
        out.append(StoredModel(rel.as_posix(), "lmstudio", path, short=(repo, rel.parts[1], *_gguf_names(rel))))
    return out

"""A disk cache of stage files, keyed by the source file's content hash and the block range."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from kafila.errors import CacheError
from kafila.model.cut import Progress, StageSpec, write_stage
from kafila.model.gguf_set import SHARD_NAME, GGUFSet

_CHUNK = 4 << 20


def default_cache_root() -> Path:
    """The user's cache directory for Kafila (KAFILA_CACHE_DIR overrides it)."""
    env = os.environ.get("KAFILA_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("kafila"))


def sha256_file(path: Path, progress: Progress | None = None, more: Sequence[Path] = ()) -> str:
    """Hex sha256 of a file's content, read in chunks (followed by `more` files': a split set as one stream)."""
    h = hashlib.sha256()
    paths = [path, *more]
    total = sum(p.stat().st_size for p in paths)
    done = 0
    for p in paths:
        with p.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
    return h.hexdigest()


def private_dir(path: Path) -> None:
    """Make `path` (0700 when new); CacheError when it is another user's or others can write it.

    Stages found in the cache are loaded by name, without hashing them again (gigabytes): in a directory
    another user can write (a shared KAFILA_CACHE_DIR), that user could plant a stage every member loads."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheError(f"the cache directory {path} belongs to another user; give this user its own "
                         "(KAFILA_CACHE_DIR)")
    if st.st_mode & 0o022:
        raise CacheError(f"the cache directory {path} can be written by other users (mode {st.st_mode & 0o777:o}); "
                         f"make it private (chmod 700 {path}) or give this user its own (KAFILA_CACHE_DIR)")


class StageCache:
    """Stage GGUFs under `root/stages/<source hash>/<kind>-<start>-<end>.gguf`, written atomically."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_root()
        private_dir(self.root)

    def source_hash(self, source: Path, progress: Progress | None = None) -> str:
        """Content hash of `source` (all files of a split set); remembered per (path, size, mtime) so big files
        are read once."""
        # The set's other files are named beside the first as the user named it: a Hugging Face snapshot
        # holds links whose targets are named by hash, so the paths are resolved only afterwards.
        named_as_set = SHARD_NAME.match(Path(source).name)  # only such a name can begin a set: skip the parse
        paths = [p.resolve() for p in (GGUFSet(source).paths if named_as_set else [Path(source)])]
        index_path = self.root / "hashes.json"
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError):
            index = {}
        key = "|".join(f"{p}|{p.stat().st_size}|{p.stat().st_mtime_ns}" for p in paths)
        if key not in index:
            index[key] = sha256_file(paths[0], progress, more=paths[1:])
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = index_path.with_name(f".hashes.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(index))
            os.replace(tmp, index_path)
        return str(index[key])

    def path_for(self, source_hash: str, spec: StageSpec) -> Path:
        return self.root / "stages" / source_hash[:32] / f"{spec.tag}.gguf"

    def stage(self, source: Path, spec: StageSpec, progress: Progress | None = None) -> Path:
        """The cached stage file for `spec`, cutting it first when it is not there.

        `progress` hears (bytes done, total) of hashing the source (when not remembered), then of
        writing the stage; it may raise to stop the work, which then leaves no file behind.
        """
        dest = self.path_for(self.source_hash(source, progress), spec)
        if dest.is_file():
            return dest
        return write_stage(source, spec, dest, progress)

"""What the user cache directory holds (cut stages, delivered stages, model copies and chunks, probes, demo logs),
and pruning it.

A running host or member lists the files it uses in `<cache>/in-use/<pid>-<token>.json` (`InUse`: one list
per session, as a process may run two, a host and its own member), so pruning never removes a stage a
running session needs; the lists of processes that are gone are ignored. Pruning and the size cap remove
the least recently used files first (a session touches the stages it uses).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from kafila.engine.probe_cache import PROBE_MAX_AGE_S

log = logging.getLogger("kafila.cache")
IN_USE = "in-use"
# kind -> the files of that kind, relative to the cache root
KINDS: dict[str, tuple[str, ...]] = {
    "stage": ("stages/*/*.gguf",),
    "delivery": ("delivered/*.gguf", "delivered/*.part"),
    "probe": ("probe-*.json",),
    "probe model": ("probe-models/*.gguf",),  # the probe's large-block random model: written again when gone
    "probe cut": ("probe-stages-*/*.gguf",),  # left by a probe that was killed (kafila.engine.probe.SCRATCH_PREFIX)
    "log": ("demo-logs/*",),
    "bench model": ("models/random-*.gguf",),  # kafila.model.random_gguf: made again when needed
    # a whole verified model: the copy for failover, from the host (copies/) or from public URLs (models/)
    "copy": ("copies/*.gguf", "copies/*.part", "models/[0-9a-f]*.gguf"),
    # a model's verified chunks fetched from public URLs (kafila.session.delivery.model_chunks): a sparse file
    "chunks": ("models/[0-9a-f]*.part",),
}


@dataclass(frozen=True)
class Entry:
    """One cached file."""

    kind: str
    path: Path
    size: int
    mtime: float
    in_use: bool

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.mtime)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def in_use(root: Path) -> set[Path]:
    """The files the running sessions on this machine listed as theirs."""
    used: set[Path] = set()
    for record in (root / IN_USE).glob("*.json"):
        try:
            pid = int(record.stem.split("-")[0])
            paths = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            record.unlink(missing_ok=True)
            continue
        if isinstance(paths, list):
            used |= {Path(p) for p in paths if isinstance(p, str)}
    return used


def inventory(root: Path) -> list[Entry]:
    """Every cached file of a known kind, oldest first."""
    used = in_use(root)
    entries = []
    for kind, patterns in KINDS.items():
        for pattern in patterns:
            for path in root.glob(pattern):
                with contextlib.suppress(OSError):  # a file another process just removed
                    st = path.stat()
                    if path.is_file():  # chunks are a sparse file: what counts is what it holds on disk
                        size = min(st.st_size, st.st_blocks * 512) if kind == "chunks" else st.st_size
                        entries.append(Entry(kind, path, size, st.st_mtime, path.resolve() in used))
    return sorted(entries, key=lambda e: e.mtime)


def _remove(entry: Entry) -> bool:
    try:
        entry.path.unlink()
    except FileNotFoundError:
        return False
    if entry.kind == "chunks":  # its bitmap and lock file go with it (kafila.session.delivery.model_chunks)
        for beside in (entry.path.with_suffix(".have"), entry.path.with_name(f".{entry.path.stem}.lock")):
            beside.unlink(missing_ok=True)
    if entry.kind == "stage":
        with contextlib.suppress(OSError):  # the model's folder, once its last stage is gone
            entry.path.parent.rmdir()
    return True


def prune(root: Path, now: float | None = None) -> list[Entry]:
    """Remove what no running session needs (a probe is kept while it is fresh); returns what went."""
    now = time.time() if now is None else now
    gone = []
    for e in inventory(root):
        fresh_probe = e.kind == "probe" and e.age_s(now) < PROBE_MAX_AGE_S
        if not e.in_use and not fresh_probe and _remove(e):
            gone.append(e)
    return gone


def enforce_cap(root: Path, max_bytes: int) -> list[Entry]:
    """Remove the least recently used files no session needs until the cache holds at most `max_bytes`."""
    entries = inventory(root)
    total = sum(e.size for e in entries)
    gone = []
    for e in entries:
        if total <= max_bytes:
            break
        if not e.in_use and _remove(e):
            total -= e.size
            gone.append(e)
    return gone


class InUse:
    """A session's list of the cache files it needs, kept while it runs (a context manager)."""

    def __init__(self, root: Path) -> None:
        # a random token, not a counter kept in the module: each session of a process has a file of its own
        self.record = root / IN_USE / f"{os.getpid()}-{secrets.token_hex(4)}.json"
        self.paths: list[str] = []

    def add(self, path: Path) -> None:
        """Mark `path` as needed, and as just used (pruning goes least recently used first)."""
        with contextlib.suppress(OSError):
            os.utime(path)
        resolved = str(Path(path).resolve())
        if resolved in self.paths:  # marked as just used above; the list is unchanged
            return
        self.paths.append(resolved)
        self.record.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.paths))
        os.replace(tmp, self.record)

    def __enter__(self) -> InUse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.record.unlink(missing_ok=True)


def start_cache_use(root: Path) -> InUse:
    """A session's start: apply the config's size cap (logging what went), then list this process's files."""
    from kafila.config import load_config

    cap = load_config().cache_max_bytes
    if cap is not None:
        gone = enforce_cap(root, cap)
        if gone:
            log.info("cache over its %.1f GB cap: removed %d files (%.1f MB), least recently used first",
                     cap / 1e9, len(gone), sum(e.size for e in gone) / 1e6)
    return InUse(root)

"""Stage delivery: the host sends each member only its stage's bytes, verified chunk by chunk.

A stage file is described by its sha256, its size and the sha256 of each CHUNK_SIZE chunk.
The member keeps a `.part` file in its cache; on (re)start it checks which chunks of that file
already verify and asks only for the rest, so an interrupted transfer resumes, and a member
that already holds the verified stage asks for nothing.

Memory stays bounded whatever the stage's size: each chunk is verified and written to the `.part`
file as it arrives (a fresh `.part` is sparse until then). Disk space is checked before the first
chunk is asked for, and running out while writing (ENOSPC) is reported the same way: DiskFullError.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from kafila.errors import DiskFullError, ProtocolError, SessionError

CHUNK_SIZE = 1 << 20
MAX_STAGE_BYTES = 1 << 40  # 1 TiB: above any stage of any model a group can pool; a lie past it is refused
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON's 1.0 and true are not sizes


@dataclass(frozen=True)
class StageManifest:
    """What a member needs to verify a stage file it receives."""

    sha256: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "chunk_size": self.chunk_size, "chunks": list(self.chunks)}

    @classmethod
    def from_dict(cls, d: Any) -> StageManifest:
        """A manifest from its wire form; ProtocolError naming the field for anything a member must not trust."""
        if not isinstance(d, dict):
            raise ProtocolError("stage manifest is malformed: not an object")
        sha256, size, chunk_size, chunks = (d.get(k) for k in ("sha256", "size", "chunk_size", "chunks"))
        # The hash becomes a file name in the cache: only 64 lowercase hex digits can never name a path elsewhere.
        if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
            raise ProtocolError("stage manifest is malformed: sha256 must be 64 lowercase hex digits")
        if not _is_int(chunk_size) or chunk_size != CHUNK_SIZE:
            raise ProtocolError(f"stage manifest is malformed: chunk_size must be {CHUNK_SIZE}, got {chunk_size!r}")
        # The receiver reserves `size` bytes on disk before the first chunk arrives: bound it.
        if not _is_int(size) or not 0 < size <= MAX_STAGE_BYTES:
            raise ProtocolError(f"stage manifest is malformed: size must be 1..{MAX_STAGE_BYTES} bytes")
        expected = -(-size // CHUNK_SIZE)
        if not isinstance(chunks, list) or len(chunks) != expected:
            raise ProtocolError(f"stage manifest is inconsistent: {size} bytes need {expected} chunk hashes")
        if not all(isinstance(c, str) and _SHA256_HEX.fullmatch(c) for c in chunks):
            raise ProtocolError("stage manifest is malformed: every chunk hash must be 64 lowercase hex digits")
        return cls(sha256, size, chunk_size, tuple(chunks))


def manifest_for(path: Path, chunk_size: int = CHUNK_SIZE,
                 progress: Callable[[int, int], None] | None = None) -> StageManifest:
    """Hash a stage file whole and per chunk; `progress` hears (bytes hashed, size) and may raise to stop."""
    whole = hashlib.sha256()
    chunks = []
    size = path.stat().st_size
    with path.open("rb") as f:
        while data := f.read(chunk_size):
            whole.update(data)
            chunks.append(hashlib.sha256(data).hexdigest())
            if progress is not None:
                progress(len(chunks) * chunk_size, size)
    return StageManifest(whole.hexdigest(), path.stat().st_size, chunk_size, tuple(chunks))


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def no_space(folder: Path, need: int) -> DiskFullError:
    """The error for a stage that needs `need` more bytes than `folder`'s filesystem has free."""
    have = shutil.disk_usage(folder).free
    return DiskFullError(f"no space left on {folder}: need {megabytes(need)}, have {megabytes(have)}")


def read_chunk(path: Path, manifest: StageManifest, index: int) -> bytes:
    with path.open("rb") as f:
        f.seek(index * manifest.chunk_size)
        return f.read(manifest.chunk_size)


class StageReceiver:
    """A member's side of one stage transfer into `cache_dir/<sha256>.gguf`."""

    def __init__(self, cache_dir: Path, manifest: StageManifest) -> None:
        self.manifest = manifest
        self.folder = cache_dir
        self.final = cache_dir / f"{manifest.sha256}.gguf"
        self.part = cache_dir / f"{manifest.sha256}.part"
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.have: set[int] = set()

    def missing(self) -> list[int]:
        """Chunk indices still needed (verifying what a previous attempt left)."""
        if self.final.is_file():
            return []
        n = len(self.manifest.chunks)
        self.have = set()
        if self.part.is_file():
            with self.part.open("rb") as f:
                for i in range(n):
                    f.seek(i * self.manifest.chunk_size)
                    if hashlib.sha256(f.read(self.manifest.chunk_size)).hexdigest() == self.manifest.chunks[i]:
                        self.have.add(i)
        else:
            with self.part.open("wb") as f:
                f.truncate(self.manifest.size)
        return [i for i in range(n) if i not in self.have]

    @property
    def bytes_missing(self) -> int:
        """Bytes still to write (the `.part` file is sparse where no chunk has landed yet)."""
        if self.final.is_file():
            return 0
        size, step = self.manifest.size, self.manifest.chunk_size
        return sum(min(step, size - i * step) for i in range(len(self.manifest.chunks)) if i not in self.have)

    def check_space(self) -> None:
        """DiskFullError when the missing chunks cannot fit on the cache's filesystem (call after missing())."""
        need = self.bytes_missing
        if need > shutil.disk_usage(self.folder).free:
            raise no_space(self.folder, need)

    def accept(self, index: int, data: bytes) -> None:
        """Store one chunk after checking its hash; ProtocolError for a bad or unexpected chunk."""
        if not 0 <= index < len(self.manifest.chunks):
            raise ProtocolError(f"stage chunk {index} is outside the manifest's {len(self.manifest.chunks)} chunks")
        if hashlib.sha256(data).hexdigest() != self.manifest.chunks[index]:
            raise ProtocolError(f"stage chunk {index} does not match its sha256: refused")
        try:
            with self.part.open("r+b") as f:
                f.seek(index * self.manifest.chunk_size)
                f.write(data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise no_space(self.folder, self.bytes_missing) from None
            raise
        self.have.add(index)

    @property
    def complete(self) -> bool:
        return self.final.is_file() or len(self.have) == len(self.manifest.chunks)

    def finish(self) -> Path:
        """Verify the whole file and move it into place atomically."""
        if self.final.is_file():
            return self.final
        h = hashlib.sha256()
        with self.part.open("rb") as f:
            while data := f.read(1 << 22):
                h.update(data)
            os.fsync(f.fileno())
        if h.hexdigest() != self.manifest.sha256:
            self.part.unlink(missing_ok=True)
            raise SessionError("the received stage does not match its sha256 as a whole; it was discarded")
        os.replace(self.part, self.final)
        return self.final


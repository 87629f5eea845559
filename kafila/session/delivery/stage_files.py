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
import shutil
from collections.abc import Callable
from pathlib import Path

from kafila.errors import DiskFullError, ProtocolError, SessionError
from kafila.session.protocol.manifest import CHUNK_SIZE, StageManifest


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

    def missing(self, progress: Callable[[int, int], None] | None = None) -> list[int]:
        """Chunk indices still needed (verifying what a previous attempt left; `progress` as manifest_for's)."""
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
                    if progress is not None:
                        progress((i + 1) * self.manifest.chunk_size, self.manifest.size)
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

    def finish(self, progress: Callable[[int, int], None] | None = None) -> Path:
        """Verify the whole file and move it into place atomically (`progress` as manifest_for's)."""
        if self.final.is_file():
            return self.final
        h, done = hashlib.sha256(), 0
        with self.part.open("rb") as f:
            while data := f.read(1 << 22):
                h.update(data)
                done += len(data)
                if progress is not None:
                    progress(done, self.manifest.size)
            os.fsync(f.fileno())
        if h.hexdigest() != self.manifest.sha256:
            self.part.unlink(missing_ok=True)
            raise SessionError("the received stage does not match its sha256 as a whole; it was discarded")
        os.replace(self.part, self.final)
        return self.final


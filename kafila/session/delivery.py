"""Stage delivery: the host sends each member only its stage's bytes, verified chunk by chunk.

A stage file is described by its sha256, its size and the sha256 of each CHUNK_SIZE chunk.
The member keeps a `.part` file in its cache; on (re)start it checks which chunks of that file
already verify and asks only for the rest, so an interrupted transfer resumes, and a member
that already holds the verified stage asks for nothing.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafila.errors import ProtocolError, SessionError

CHUNK_SIZE = 1 << 20


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
        try:
            m = cls(str(d["sha256"]), int(d["size"]), int(d["chunk_size"]), tuple(str(c) for c in d["chunks"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"stage manifest is malformed: {exc}") from None
        expected = -(-m.size // m.chunk_size) if m.size else 0
        if m.chunk_size <= 0 or len(m.chunks) != expected or len(m.sha256) != 64:
            raise ProtocolError("stage manifest is inconsistent (chunk count, size or hash length)")
        return m


def manifest_for(path: Path, chunk_size: int = CHUNK_SIZE) -> StageManifest:
    """Hash a stage file whole and per chunk."""
    whole = hashlib.sha256()
    chunks = []
    with path.open("rb") as f:
        while data := f.read(chunk_size):
            whole.update(data)
            chunks.append(hashlib.sha256(data).hexdigest())
    return StageManifest(whole.hexdigest(), path.stat().st_size, chunk_size, tuple(chunks))


def read_chunk(path: Path, manifest: StageManifest, index: int) -> bytes:
    with path.open("rb") as f:
        f.seek(index * manifest.chunk_size)
        return f.read(manifest.chunk_size)


class StageReceiver:
    """A member's side of one stage transfer into `cache_dir/<sha256>.gguf`."""

    def __init__(self, cache_dir: Path, manifest: StageManifest) -> None:
        self.manifest = manifest
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

    def accept(self, index: int, data: bytes) -> None:
        """Store one chunk after checking its hash; ProtocolError for a bad or unexpected chunk."""
        if not 0 <= index < len(self.manifest.chunks):
            raise ProtocolError(f"stage chunk {index} is outside the manifest's {len(self.manifest.chunks)} chunks")
        if hashlib.sha256(data).hexdigest() != self.manifest.chunks[index]:
            raise ProtocolError(f"stage chunk {index} does not match its sha256: refused")
        with self.part.open("r+b") as f:
            f.seek(index * self.manifest.chunk_size)
            f.write(data)
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


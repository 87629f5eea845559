"""The whole model file arriving chunk by chunk from any source, each chunk verified before it is written.

A member keeps `folder/<sha256>.part`, a sparse file of the model's full size, and beside it
`<sha256>.have`, a bitmap of the chunks written there after their sha256 matched the host's model
manifest (bit i of byte i // 8, lowest bit first). The bitmap is replaced atomically after each
chunk, and on a restart every chunk it lists is hashed again, so a crash between a chunk's bytes and
its bit costs that chunk, never a wrong byte. Reading a chunk the bitmap does not hold is an error
(UnverifiedRead): a sparse file's holes read as zeros, which must never reach a stage. Once every
chunk is held the whole file is checked against the manifest's sha256 and becomes `<sha256>.gguf`.
Members on one machine (a demo, a lab's shared cache) share the store: its files change only under a lock
file, and each process takes the chunks the others verified from the bitmap when it writes its own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kafila.errors import ProtocolError, SessionError
from kafila.session.delivery.stage_files import manifest_for, no_space
from kafila.session.protocol.model_manifest import ModelManifest, chunk_size_for


class ChunkRefused(ProtocolError):
    """A chunk whose bytes do not match the manifest's sha256; `source` names who sent it."""

    def __init__(self, index: int, source: str) -> None:
        super().__init__(f"chunk {index} of the model from {source} does not match the host's sha256: refused")
        self.index, self.source = index, source


class UnverifiedRead(SessionError):
    """A read of model bytes no verified chunk holds yet (a hole of the sparse file, never to be used as zeros)."""


class ChunkStore:
    """A member's sparse, verified copy of the model file in `folder`, resumable after a restart."""

    def __init__(self, folder: Path, manifest: ModelManifest) -> None:
        self.manifest, self.folder = manifest, folder
        self.part = folder / f"{manifest.sha256}.part"
        self.sidecar = folder / f"{manifest.sha256}.have"
        self.final = folder / f"{manifest.sha256}.gguf"
        self._lock = folder / f".{manifest.sha256}.lock"
        folder.mkdir(parents=True, exist_ok=True)
        self._bits = bytearray(-(-manifest.n_chunks // 8))
        with self._locked():
            if self.final.is_file():
                self._all()
            elif self.part.is_file() and self.sidecar.is_file():
                self._resume()
            else:
                with self.part.open("wb") as f:
                    f.truncate(manifest.size)  # sparse until chunks land
                self._save()

    @property
    def files(self) -> tuple[Path, ...]:
        """The files a session using the store needs kept (kafila.session.delivery.cache_inventory.InUse)."""
        return self.part, self.sidecar, self.final

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Held while the files change: members on one machine share the store (a demo's, a lab's cache)."""
        with self._lock.open("a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _all(self) -> None:
        self._bits = bytearray(b"\xff" * len(self._bits))

    def _resume(self) -> None:
        """Keep the chunks the bitmap lists that still verify (a crash may have lost a chunk's bytes)."""
        listed = self.sidecar.read_bytes()
        if len(listed) != len(self._bits) or self.part.stat().st_size != self.manifest.size:
            with self.part.open("r+b") as f:
                f.truncate(self.manifest.size)
            listed = bytes(len(self._bits))
        with self.part.open("rb") as f:
            for i in range(self.manifest.n_chunks):
                if listed[i // 8] >> (i % 8) & 1:
                    f.seek(i * self.manifest.chunk_size)
                    if hashlib.sha256(f.read(self.manifest.chunk_size)).hexdigest() == self.manifest.chunks[i]:
                        self._bits[i // 8] |= 1 << (i % 8)
        self._save()

    def _merge(self) -> None:
        """Take the chunks another process sharing the store verified (under the lock: its bitmap is current)."""
        theirs = self.sidecar.read_bytes() if self.sidecar.is_file() else b""
        if len(theirs) == len(self._bits):
            self._bits = bytearray(a | b for a, b in zip(self._bits, theirs, strict=True))

    def _save(self) -> None:
        tmp = self.sidecar.with_name(f".{self.sidecar.name}.{os.getpid()}.tmp")
        tmp.write_bytes(bytes(self._bits))
        os.replace(tmp, self.sidecar)

    @property
    def path(self) -> Path:
        """The file to read the model from: the whole verified file once finished, else the `.part`."""
        return self.final if self.final.is_file() else self.part

    def holds(self, index: int) -> bool:
        return 0 <= index < self.manifest.n_chunks and bool(self._bits[index // 8] >> (index % 8) & 1)

    def held(self) -> list[int]:
        """The verified chunks, in order."""
        return [i for i in range(self.manifest.n_chunks) if self.holds(i)]

    def missing(self, wanted: Iterable[int]) -> list[int]:
        """Those of `wanted` not yet held, in order."""
        return sorted(i for i in set(wanted) if not self.holds(i))

    @property
    def complete(self) -> bool:
        return all(self.holds(i) for i in range(self.manifest.n_chunks))

    def bytes_held(self) -> int:
        return sum(end - start for start, end in map(self.manifest.span, self.held()))

    def accept(self, index: int, data: bytes, source: str) -> None:
        """Write one chunk after checking its hash; ChunkRefused (naming `source`) when it does not match."""
        if not 0 <= index < self.manifest.n_chunks:
            raise ProtocolError(f"chunk {index} from {source} is outside the model's {self.manifest.n_chunks} chunks")
        if self.holds(index):
            return
        if hashlib.sha256(data).hexdigest() != self.manifest.chunks[index]:
            raise ChunkRefused(index, source)
        try:
            with self._locked():
                if self.final.is_file():  # another process sharing the store finished the whole file
                    self._all()
                    return
                with self.part.open("r+b") as f:
                    f.seek(index * self.manifest.chunk_size)
                    f.write(data)
                self._merge()
                self._bits[index // 8] |= 1 << (index % 8)
                self._save()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise no_space(self.folder, self.manifest.size - self.bytes_held()) from None
            raise

    def read(self, index: int) -> bytes:
        """A verified chunk's bytes (what a member serves to a peer); UnverifiedRead when it is not held."""
        return self.read_range(*self.manifest.span(index))

    def read_range(self, start: int, end: int) -> bytes:
        """The file's bytes [start, end), every one of them from a verified chunk (else UnverifiedRead)."""
        lacking = [i for i in self.manifest.covering(start, end) if not self.holds(i)]
        if lacking or not 0 <= start <= end <= self.manifest.size:
            raise UnverifiedRead(f"bytes [{start}, {end}) of the model are not all verified here "
                                 f"(chunks {lacking[:8]} not held)")
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def prefix_chunks(self) -> int:
        """How many chunks from the file's start are all held."""
        n = 0
        while n < self.manifest.n_chunks and self.holds(n):
            n += 1
        return n

    def prefix(self, limit: int) -> bytes:
        """The file's verified start, at most `limit` bytes: every byte up to its first chunk not held."""
        return self.read_range(0, min(self.prefix_chunks() * self.manifest.chunk_size, self.manifest.size, limit))

    def finish(self) -> Path:
        """Check the whole file against the manifest's sha256 and move it into place as `<sha256>.gguf`."""
        with self._locked():
            if self.final.is_file():  # this process's or another's sharing the store
                self._all()
                return self.final
            self._merge()
            if not self.complete:
                raise UnverifiedRead(f"the model is not whole yet: "
                                     f"{len(self.missing(range(self.manifest.n_chunks)))} chunks missing")
            h = hashlib.sha256()
            with self.part.open("rb") as f:
                while data := f.read(1 << 22):
                    h.update(data)
                os.fsync(f.fileno())
            if h.hexdigest() != self.manifest.sha256:  # every chunk verified: only a bug or a disk fault gets here
                raise SessionError(f"the model's chunks all verified but the whole file has sha256 {h.hexdigest()}, "
                                   f"not the manifest's {self.manifest.sha256}")
            os.replace(self.part, self.final)
            self.sidecar.unlink(missing_ok=True)
            return self.final


def model_manifest(root: Path, model: Path, progress: Callable[[int, int], None] | None = None) -> ModelManifest:
    """The host's manifest of `model`, hashed once per (path, size, mtime): later calls read it from
    `root/manifests` (a 40 GB model takes minutes to hash; `progress` hears only a real hashing)."""
    resolved = model.resolve()
    st = resolved.stat()
    key = hashlib.sha256(f"{resolved}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    saved = root / "manifests" / f"{key}.json"
    try:
        return ModelManifest.from_dict(json.loads(saved.read_text()))
    except (OSError, ValueError, ProtocolError):
        pass  # not hashed yet, or a damaged record: hash again
    m = manifest_for(resolved, chunk_size_for(st.st_size), progress=progress)
    manifest = ModelManifest(m.sha256, m.size, m.chunk_size, m.chunks)
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = saved.with_name(f".{saved.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest.as_dict()))
    os.replace(tmp, saved)
    return manifest

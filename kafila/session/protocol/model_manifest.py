"""The model manifest's wire form: the host's word on every chunk of the whole model file.

    {"sha256": hex, "size": bytes, "chunk_size": chunk_size_for(size), "digests": base64 of the chunks' sha256s}

Chunk i is bytes [i * chunk_size, min((i + 1) * chunk_size, size)) of the model file. Whatever source a
chunk comes from (a peer, a public URL, the host), a member writes it only once its sha256 equals the
manifest's (delivery.model_chunks.ChunkStore); the host is the one authority on these hashes.

The digests go as binary (base64), and a model past 16 GiB gets larger chunks, so a manifest stays within
MAX_CHUNKS digests (about 700 KB on the wire) and fits in an assignment beside the stage's own manifest.
The chunk size follows from the size alone, so a host cannot pick another.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kafila.errors import ProtocolError
from kafila.session.protocol.manifest import CHUNK_SIZE, hashed_file_fields

MAX_MODEL_BYTES = 1 << 40  # 1 TiB: above any model a group can pool; a lie past it is refused
MAX_CHUNKS = 1 << 14
MAX_URLS = 8
MAX_URL = 2048


def chunk_size_for(size: int) -> int:
    """The model manifest's chunk: 1 MiB, doubled until `size` takes at most MAX_CHUNKS of them."""
    chunk = CHUNK_SIZE
    while -(-size // chunk) > MAX_CHUNKS:
        chunk *= 2
    return chunk


@dataclass(frozen=True)
class ModelManifest:
    """The sha256 of a whole model file and of each of its chunks."""

    sha256: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def span(self, index: int) -> tuple[int, int]:
        """Chunk `index`'s [start, end) bytes in the file."""
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.size)

    def covering(self, start: int, end: int) -> range:
        """The chunks holding any of the file's bytes [start, end) (empty when end <= start)."""
        if end <= start:
            return range(0)
        return range(start // self.chunk_size, min(-(-end // self.chunk_size), self.n_chunks))

    def as_dict(self) -> dict[str, Any]:
        digests = b"".join(bytes.fromhex(c) for c in self.chunks)
        return {"sha256": self.sha256, "size": self.size, "chunk_size": self.chunk_size,
                "digests": base64.b64encode(digests).decode()}

    @classmethod
    def from_dict(cls, d: Any) -> ModelManifest:
        """A manifest from its wire form; ProtocolError naming the field for anything a member must not trust."""
        what = "model manifest"
        if not isinstance(d, dict):
            raise ProtocolError(f"{what} is malformed: not an object")
        size, chunk_size, digests = d.get("size"), d.get("chunk_size"), d.get("digests")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_MODEL_BYTES:
            raise ProtocolError(f"{what} is malformed: size must be 1..{MAX_MODEL_BYTES} bytes")
        if chunk_size != chunk_size_for(size):
            raise ProtocolError(f"{what} is malformed: chunk_size must be {chunk_size_for(size)} for {size} bytes, "
                                f"got {chunk_size!r}")
        try:
            raw = base64.b64decode(digests, validate=True) if isinstance(digests, str) else None
        except binascii.Error:
            raw = None
        if raw is None or len(raw) % 32:
            raise ProtocolError(f"{what} is malformed: digests must be base64 of 32-byte sha256s")
        chunks = [raw[i:i + 32].hex() for i in range(0, len(raw), 32)]
        # the shared checks (the whole file's hash, the count of chunks) on the hex form
        fields = hashed_file_fields({"sha256": d.get("sha256"), "size": size, "chunk_size": chunk_size,
                                     "chunks": chunks}, what, MAX_MODEL_BYTES, chunk_size)
        return cls(*fields)


@dataclass(frozen=True)
class ModelSource:
    """What a member needs to fetch the model's chunks from elsewhere than the host: the host's manifest of the
    whole file and public URLs of the same file (checked chunk by chunk against the manifest)."""

    manifest: ModelManifest
    urls: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"manifest": self.manifest.as_dict(), "urls": list(self.urls)}

    @classmethod
    def from_dict(cls, d: Any) -> ModelSource:
        """A source from its wire form; ProtocolError for a malformed manifest or URL."""
        if not isinstance(d, dict):
            raise ProtocolError("model source is malformed: not an object")
        urls = d.get("urls")
        if not isinstance(urls, list) or not 0 < len(urls) <= MAX_URLS:
            raise ProtocolError(f"model source is malformed: urls must be a list of 1..{MAX_URLS} URLs")
        for url in urls:
            check_url(url)
        return cls(ModelManifest.from_dict(d.get("manifest")), tuple(urls))


def check_url(url: Any) -> str:
    """An http(s) URL with a host, at most MAX_URL characters; ProtocolError naming what is wrong otherwise."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise ProtocolError(f"model source is malformed: a URL must be a string of at most {MAX_URL} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProtocolError(f"model source URL {url[:80]!r} is not an http(s) URL with a host")
    return url

"""The model manifest's wire form: the host's word on every chunk of the whole model file.

    {"sha256": hex, "size": bytes, "chunk_size": CHUNK_SIZE, "chunks": [hex per chunk]}

Chunk i is bytes [i * chunk_size, min((i + 1) * chunk_size, size)) of the model file. Whatever source a
chunk comes from (a peer, a public URL, the host), a member writes it only once its sha256 equals the
manifest's (delivery.model_chunks.ChunkStore); the host is the one authority on these hashes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafila.session.protocol.manifest import hashed_file_fields

MAX_MODEL_BYTES = 1 << 40  # 1 TiB: above any model a group can pool; a lie past it is refused


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
        return {"sha256": self.sha256, "size": self.size, "chunk_size": self.chunk_size, "chunks": list(self.chunks)}

    @classmethod
    def from_dict(cls, d: Any) -> ModelManifest:
        """A manifest from its wire form; ProtocolError naming the field for anything a member must not trust."""
        return cls(*hashed_file_fields(d, "model manifest", MAX_MODEL_BYTES))

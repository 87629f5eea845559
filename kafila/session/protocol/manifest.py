"""A stage manifest's wire form: what a member needs to verify a stage file it receives.

The host hashes a stage file (kafila.session.delivery.stage_files.manifest_for) and sends this
in its assign message; the member checks every field before it trusts any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from kafila.errors import ProtocolError

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
        return cls(*hashed_file_fields(d, "stage manifest", MAX_STAGE_BYTES))


def hashed_file_fields(d: Any, what: str, max_bytes: int,
                       chunk: int = CHUNK_SIZE) -> tuple[str, int, int, tuple[str, ...]]:
    """(sha256, size, chunk_size, chunk hashes) of a file's manifest in wire form, each checked; ProtocolError
    naming `what` and the field otherwise (a stage's manifest and the whole model's share this form; `chunk`
    is the chunk size it must have)."""
    if not isinstance(d, dict):
        raise ProtocolError(f"{what} is malformed: not an object")
    sha256, size, chunk_size, chunks = (d.get(k) for k in ("sha256", "size", "chunk_size", "chunks"))
    # The hash becomes a file name in the cache: only 64 lowercase hex digits can never name a path elsewhere.
    if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
        raise ProtocolError(f"{what} is malformed: sha256 must be 64 lowercase hex digits")
    if not _is_int(chunk_size) or chunk_size != chunk:
        raise ProtocolError(f"{what} is malformed: chunk_size must be {chunk}, got {chunk_size!r}")
    # The receiver reserves `size` bytes on disk before the first chunk arrives: bound it.
    if not _is_int(size) or not 0 < size <= max_bytes:
        raise ProtocolError(f"{what} is malformed: size must be 1..{max_bytes} bytes")
    expected = -(-size // chunk)
    if not isinstance(chunks, list) or len(chunks) != expected:
        raise ProtocolError(f"{what} is inconsistent: {size} bytes need {expected} chunk hashes")
    if not all(isinstance(c, str) and _SHA256_HEX.fullmatch(c) for c in chunks):
        raise ProtocolError(f"{what} is malformed: every chunk hash must be 64 lowercase hex digits")
    return sha256, size, chunk_size, tuple(chunks)

"""A member's own copy of the model (`kafila join CODE --model PATH`): announced by hash, judged, cut locally.

The biggest saving in stage delivery is not sending at all. A member that already holds the host's
whole model file announces the file's sha256; when it equals the host's, the host tells it to cut
its stage itself, and the member checks the cut against the host's manifest exactly as it checks a
delivered stage. A file that differs is refused with both hashes: the user named a file they meant to
be the host's model, so silently sending gigabytes instead would hide a mistake.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafila.errors import SessionError
from kafila.model.cut import Progress, StageSpec
from kafila.model.gguf_set import SHARD_NAME, GGUFSet
from kafila.model.stage_cache import StageCache
from kafila.session.delivery.stage_files import manifest_for, no_space
from kafila.session.protocol.manifest import StageManifest

MODEL_KEY = "model_sha256"  # the announcement's measurement naming the member's own model file
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def model_claim(cache: StageCache, model: Path, progress: Progress | None = None) -> dict[str, str]:
    """What a member with its own model file announces (the hash is cached by path, size and mtime)."""
    return {MODEL_KEY: cache.source_hash(model, progress)}


def claimed_hash(measurements: Mapping[str, Any]) -> str | None:
    """The model hash a member announced, or None when it holds no model of its own."""
    claim = measurements.get(MODEL_KEY)
    return claim if isinstance(claim, str) else None


PROOF_READS = 16  # pieces of the file a proof reads (a guess of one 4 KiB piece never succeeds)
PROOF_PIECE = 4096


def model_proof(model: Path, nonce: bytes) -> str:
    """SHA-256 (hex) of `nonce` and PROOF_READS pieces of the model (all files of a split set, as one stream) at
    offsets the nonce chooses: only whoever holds the file can answer, and no earlier answer is any use."""
    paths = GGUFSet(model).paths if SHARD_NAME.match(model.name) else [model]
    sizes = [p.stat().st_size for p in paths]
    total = sum(sizes)
    h = hashlib.sha256(nonce)
    for i in range(PROOF_READS):
        pick = int.from_bytes(hmac.new(nonce, i.to_bytes(4, "big"), hashlib.sha256).digest()[:8], "big")
        h.update(_read_stream(paths, sizes, pick % max(total - PROOF_PIECE, 1), PROOF_PIECE))
    return h.hexdigest()


def _read_stream(paths: list[Path], sizes: list[int], offset: int, n: int) -> bytes:
    """`n` bytes from `offset` of the files read as one stream (fewer at its end)."""
    out = bytearray()
    for path, size in zip(paths, sizes, strict=True):
        if offset >= size:
            offset -= size
            continue
        with path.open("rb") as f:
            f.seek(offset)
            out += f.read(n - len(out))
        offset = 0
        if len(out) >= n:
            break
    return bytes(out)


def judge_model(host_sha256: str, name: str, measurements: Mapping[str, Any]) -> str | None:
    """Why the host refuses this member's model file (None: no claim, or the same file as the host's)."""
    if MODEL_KEY not in measurements:
        return None
    claim = measurements[MODEL_KEY]
    if not isinstance(claim, str) or not _SHA256_HEX.fullmatch(claim):
        return f"{name} announced a malformed model hash ({str(claim)[:80]!r})"
    if claim != host_sha256:
        return (f"the --model file of {name} has sha256 {claim}, but the host's model has sha256 {host_sha256}: "
                f"not the same model (point --model at a copy of the host's file, or join without --model "
                f"to receive the stage over the network)")
    return None


def cut_locally(cache: StageCache, model: Path, spec: StageSpec, manifest: StageManifest,
                progress: Progress | None = None) -> Path:
    """Cut this member's stage from its own model file and verify it as a delivered stage is verified.

    `progress` hears the hashing and the cut, then the verification, each from 0; it may raise to stop."""
    try:
        path = cache.stage(model, spec, progress)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # said as a delivery says it: the host plans again without us
            raise no_space(cache.root, manifest.size) from None
        raise
    got = manifest_for(path, progress=progress)
    if got != manifest:
        raise SessionError(f"the stage cut locally from {model} has sha256 {got.sha256} ({got.size} bytes), but the "
                           f"host's manifest says {manifest.sha256} ({manifest.size} bytes): is this Kafila the "
                           f"host's version? Join without --model to receive the stage over the network")
    return path

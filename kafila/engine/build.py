"""The llama.cpp build identity that members compare before computing together.

Two builds that differ (llama.cpp version, compiled CPU features, the libraries themselves)
may round differently, and a ring must give the same numbers as one context; so members
exchange this identity and refuse a mismatch before any stage runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

_LIBS = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")


@dataclass(frozen=True)
class BuildIdentity:
    """What must match between members: binding version, library content hash, CPU feature set."""

    llama_cpp_python: str
    libs_sha256: str  # over the shared libraries' bytes, first 16 hex digits
    features: str  # llama.cpp's system info line (compiled ISA features)

    def describe(self) -> str:
        return f"llama-cpp-python {self.llama_cpp_python}, llama.cpp libs {self.libs_sha256}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def differences(self, other: BuildIdentity) -> list[str]:
        """Human-readable list of what differs from `other` (empty when compatible)."""
        out = []
        for key, mine in self.as_dict().items():
            theirs = getattr(other, key)
            if mine != theirs:
                out.append(f"{key}: {mine!r} here, {theirs!r} there")
        return out


@cache
def build_identity() -> BuildIdentity:
    """This process's llama.cpp build identity (hashes the shared libraries once)."""
    from kafila.engine.llama_lib import llama

    lc = llama()
    lib_dir = Path(lc.__file__).parent / "lib"
    h = hashlib.sha256()
    for name in _LIBS:
        candidates = sorted(lib_dir.glob(name + "*"))
        if candidates:
            h.update(candidates[0].read_bytes())
    features = lc.llama_print_system_info().decode().strip()
    return BuildIdentity(lc.__version__, h.hexdigest()[:16], features)


def build_tag(b: BuildIdentity) -> str:
    """A compact build identity for announcements: version/libs/features-hash."""
    features = hashlib.sha256(b.features.encode()).hexdigest()[:8]
    return f"{b.llama_cpp_python}/{b.libs_sha256}/{features}"

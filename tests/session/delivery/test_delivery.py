"""Stage delivery: a manifest from the wire is trusted only when it can name nothing but a file in the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError
from kafila.session.delivery.stage_files import StageReceiver, manifest_for, read_chunk
from kafila.session.protocol.manifest import CHUNK_SIZE, MAX_STAGE_BYTES, StageManifest

pytestmark = pytest.mark.fast

H = "ab" * 32  # a well-formed sha256


def wire(**changes: Any) -> dict[str, Any]:
    """A valid manifest's wire form for a 2.5-chunk file, with some fields replaced."""
    d: dict[str, Any] = {"sha256": H, "size": 2 * CHUNK_SIZE + 5, "chunk_size": CHUNK_SIZE, "chunks": [H, H, H]}
    d.update(changes)
    return d


def test_a_real_stage_travels_and_resumes(tmp_path: Path) -> None:
    src = tmp_path / "stage.gguf"
    src.write_bytes(bytes(range(256)) * (CHUNK_SIZE // 256) * 2 + b"tail")  # 2 chunks and a bit
    m = StageManifest.from_dict(json.loads(json.dumps(manifest_for(src).as_dict())))
    cache = tmp_path / "cache"
    rx = StageReceiver(cache, m)
    assert rx.missing() == [0, 1, 2]
    rx.accept(1, read_chunk(src, m, 1))
    # interrupted here: a new receiver finds chunk 1 already verified in the .part file
    rx = StageReceiver(cache, m)
    assert rx.missing() == [0, 2]
    for i in (0, 2):
        rx.accept(i, read_chunk(src, m, i))
    assert rx.complete and rx.finish().read_bytes() == src.read_bytes()
    assert [p.name for p in cache.iterdir()] == [f"{m.sha256}.gguf"]


@pytest.mark.parametrize("sha", [
    "./" * 32,  # length 64: a path that stays in the cache only by luck
    "../" * 21 + "x",  # length 64: writes outside the cache
    "AB" * 32,  # upper case: not what hexdigest() gives, so never a cached name
    "ab" * 31 + "a",
    "ab" * 32 + "\n",
    "/" + "a" * 63,
    64,
    None,
])
def test_a_hash_that_is_not_64_hex_digits_is_refused(sha: object) -> None:
    with pytest.raises(ProtocolError, match="sha256 must be 64 lowercase hex digits"):
        StageManifest.from_dict(wire(sha256=sha))


@pytest.mark.parametrize("chunk_size", [0, -1, 1, CHUNK_SIZE // 2, CHUNK_SIZE * 2, float(CHUNK_SIZE), str(CHUNK_SIZE),
                                        True, None])
def test_only_the_protocols_chunk_size_is_accepted(chunk_size: object) -> None:
    with pytest.raises(ProtocolError, match=f"chunk_size must be {CHUNK_SIZE}"):
        StageManifest.from_dict(wire(chunk_size=chunk_size))


@pytest.mark.parametrize("size", [0, -5, MAX_STAGE_BYTES + 1, 64 << 40, 1.5, "5", True, None])
def test_a_size_out_of_bounds_is_refused(size: object) -> None:
    with pytest.raises(ProtocolError, match="size must be"):
        StageManifest.from_dict(wire(size=size))


def test_sizes_and_chunk_counts_must_agree() -> None:
    with pytest.raises(ProtocolError, match="need 3 chunk hashes"):
        StageManifest.from_dict(wire(chunks=[H, H]))
    with pytest.raises(ProtocolError, match="need 1 chunk hashes"):
        StageManifest.from_dict(wire(size=5, chunks=[]))
    with pytest.raises(ProtocolError, match="every chunk hash"):
        StageManifest.from_dict(wire(chunks=[H, H, "x" * 64]))
    with pytest.raises(ProtocolError, match="not an object"):
        StageManifest.from_dict([H, 5])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
# Close to valid, so the fuzz reaches every check rather than stopping at the first.
FIELD = {
    "sha256": st.sampled_from([H, "./" * 32, "../" * 21 + "x", "AB" * 32]) | st.text(min_size=60, max_size=68),
    "size": st.integers(-2, 3 * CHUNK_SIZE) | st.sampled_from([MAX_STAGE_BYTES, MAX_STAGE_BYTES + 1]) | JSON,
    "chunk_size": st.sampled_from([CHUNK_SIZE, 0, float(CHUNK_SIZE), True]) | JSON,
    "chunks": st.lists(st.sampled_from([H, "cd" * 32, "g" * 64]), max_size=4) | JSON,
}
NEAR_VALID = st.fixed_dictionaries({}, optional=FIELD)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(JSON, NEAR_VALID))
def test_fuzz_any_json_is_a_manifest_in_the_cache_or_a_protocol_error(tmp_path: Path, value: object) -> None:
    try:
        m = StageManifest.from_dict(json.loads(json.dumps(value)))
    except ProtocolError:
        return
    assert m.chunk_size == CHUNK_SIZE and 0 < m.size <= MAX_STAGE_BYTES
    assert len(m.chunks) * CHUNK_SIZE >= m.size > (len(m.chunks) - 1) * CHUNK_SIZE
    rx = StageReceiver(tmp_path / "cache", m)
    assert rx.final.parent == rx.part.parent == tmp_path / "cache"
    assert rx.final.resolve().parent == (tmp_path / "cache").resolve()


def _parses(value: object) -> bool:
    try:
        StageManifest.from_dict(value)
    except ProtocolError:
        return False
    return True


def test_the_fuzz_reaches_valid_manifests() -> None:
    """A guard on the fuzz above: its near-valid inputs do get through, so its assertions are exercised."""
    # Each value is one FIELD's strategy can draw (a search for one with `find` was left to chance).
    valid = {"sha256": H, "size": CHUNK_SIZE + 1, "chunk_size": CHUNK_SIZE, "chunks": [H, "cd" * 32]}
    assert _parses(valid)
    assert not _parses({**valid, "chunks": [H]}) and not _parses({**valid, "sha256": "../" * 21 + "x"})

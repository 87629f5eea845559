"""Stage delivery on a member's side (kafila.session.delivery.stage_files): an interrupted transfer resumes from its
`.part`, a verified copy is not fetched again, and a chunk or a whole file that does not match is refused.

Real files in a real cache folder; the chunks come from the sender's own `read_chunk` of the source file.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafila.errors import ProtocolError, SessionError
from kafila.session.delivery.stage_files import StageReceiver, manifest_for, read_chunk
from kafila.session.protocol.manifest import StageManifest

pytestmark = pytest.mark.fast

CHUNK = 1024


def stage_file(folder: Path, size: int, seed: int = 0) -> Path:
    """A stand-in stage: `size` random bytes (delivery treats a stage as bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "stage.gguf"
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def send(receiver: StageReceiver, source: Path, indices: list[int]) -> None:
    for i in indices:
        receiver.accept(i, read_chunk(source, receiver.manifest, i))


def test_a_whole_transfer_lands_verified_and_the_part_is_gone(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 3 * CHUNK + 100)  # the last chunk is short
    manifest = manifest_for(source, CHUNK)
    rx = StageReceiver(tmp_path / "cache", manifest)
    assert rx.missing() == [0, 1, 2, 3]
    send(rx, source, rx.missing())
    assert rx.complete
    final = rx.finish()
    assert final.read_bytes() == source.read_bytes()
    assert final.name == f"{manifest.sha256}.gguf" and not rx.part.exists()


def test_an_interrupted_transfer_resumes_with_only_the_missing_chunks(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 5 * CHUNK)
    manifest = manifest_for(source, CHUNK)
    first = StageReceiver(tmp_path / "cache", manifest)
    assert first.missing() == [0, 1, 2, 3, 4]  # a start always asks what is missing first
    send(first, source, [0, 3, 4])
    assert not first.complete  # the member stops here: the .part stays behind
    again = StageReceiver(tmp_path / "cache", manifest)  # a new start reads what the .part holds
    assert again.missing() == [1, 2]
    send(again, source, again.missing())
    assert again.complete and again.finish().read_bytes() == source.read_bytes()


def test_a_damaged_chunk_in_the_part_is_asked_for_again(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 4 * CHUNK)
    manifest = manifest_for(source, CHUNK)
    first = StageReceiver(tmp_path / "cache", manifest)
    send(first, source, first.missing())
    with first.part.open("r+b") as f:  # one byte of chunk 2 changes on disk before the finish
        f.seek(2 * CHUNK + 17)
        byte = f.read(1)
        f.seek(2 * CHUNK + 17)
        f.write(bytes([byte[0] ^ 0xFF]))
    again = StageReceiver(tmp_path / "cache", manifest)
    assert again.missing() == [2]
    send(again, source, [2])
    assert again.finish().read_bytes() == source.read_bytes()


def test_a_member_holding_the_verified_stage_asks_for_nothing(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 2 * CHUNK + 1)
    manifest = manifest_for(source, CHUNK)
    first = StageReceiver(tmp_path / "cache", manifest)
    send(first, source, first.missing())
    held = first.finish()
    before = held.stat().st_mtime_ns
    again = StageReceiver(tmp_path / "cache", manifest)
    assert again.missing() == [] and again.complete
    assert again.finish() == held and held.stat().st_mtime_ns == before  # not rewritten
    assert not again.part.exists()  # and no new .part was started


def test_a_chunk_that_does_not_match_is_refused_and_not_written(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 3 * CHUNK)
    manifest = manifest_for(source, CHUNK)
    rx = StageReceiver(tmp_path / "cache", manifest)
    rx.missing()
    good = read_chunk(source, manifest, 1)
    bad = bytes([good[0] ^ 1]) + good[1:]
    with pytest.raises(ProtocolError, match=r"stage chunk 1 does not match its sha256: refused"):
        rx.accept(1, bad)
    assert 1 not in rx.have and rx.part.read_bytes()[CHUNK:2 * CHUNK] == bytes(CHUNK)  # nothing written
    with pytest.raises(ProtocolError, match=r"stage chunk 3 is outside the manifest's 3 chunks"):
        rx.accept(3, good)
    with pytest.raises(ProtocolError, match=r"outside"):
        rx.accept(-1, good)
    # the transfer goes on with the right bytes
    send(rx, source, rx.missing())
    assert rx.finish().read_bytes() == source.read_bytes()


def test_a_whole_file_that_does_not_match_is_discarded(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 2 * CHUNK)
    real = manifest_for(source, CHUNK)
    # every chunk verifies, but the whole-file hash names another file: the host's manifest and the
    # chunks disagree, so nothing may be kept under either name
    wrong = StageManifest("0" * 64, real.size, real.chunk_size, real.chunks)
    rx = StageReceiver(tmp_path / "cache", wrong)
    send(rx, source, rx.missing())
    assert rx.complete
    with pytest.raises(SessionError, match="does not match its sha256 as a whole; it was discarded"):
        rx.finish()
    assert not rx.part.exists() and not rx.final.exists()
    assert StageReceiver(tmp_path / "cache", wrong).missing() == [0, 1]  # starts over


def test_an_empty_stage(tmp_path: Path) -> None:
    source = stage_file(tmp_path / "host", 0)
    rx = StageReceiver(tmp_path / "cache", manifest_for(source, CHUNK))
    assert rx.missing() == [] and rx.complete
    assert rx.finish().read_bytes() == b""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 6 * CHUNK), st.data())
def test_any_interruptions_in_any_order_end_with_the_same_bytes(tmp_path: Path, size: int, data: st.DataObject) -> None:
    folder = tmp_path / f"case-{size}-{os.urandom(4).hex()}"
    source = stage_file(folder / "host", size, seed=size)
    manifest = manifest_for(source, CHUNK)
    order = data.draw(st.permutations(range(len(manifest.chunks))))
    stops = sorted(data.draw(st.sets(st.integers(0, len(order)), max_size=3)))
    sent = 0
    for stop in [*stops, len(order)]:  # a restart at each stop, the .part carried over
        rx = StageReceiver(folder / "cache", manifest)
        assert sorted(rx.missing()) == sorted(order[sent:])
        send(rx, source, list(order[sent:stop]))
        sent = max(sent, stop)
    assert rx.complete and rx.finish().read_bytes() == source.read_bytes()

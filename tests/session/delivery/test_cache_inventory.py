"""The cache inventory on a temporary cache: listing, pruning around running sessions, the size cap."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafila.model.random_gguf import TEST_SHAPE, write_random_gguf
from kafila.session.delivery.cache_inventory import InUse, enforce_cap, in_use, inventory, prune
from kafila.session.delivery.model_chunks import ChunkStore, model_manifest

pytestmark = pytest.mark.fast

DAY = 24 * 3600


def _file(root: Path, rel: str, size: int, age_s: float) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def _cache(root: Path) -> dict[str, Path]:
    return {
        "old_stage": _file(root, "stages/abc/body-0-10.gguf", 5000, 3 * DAY),
        "new_stage": _file(root, "stages/abc/head-10-30.gguf", 3000, 3600),
        "delivered": _file(root, "delivered/" + "d" * 64 + ".gguf", 2000, 2 * DAY),
        "part": _file(root, "delivered/" + "e" * 64 + ".part", 1000, 5 * DAY),
        "old_probe": _file(root, "probe-all-threads.json", 10, 2 * DAY),
        "fresh_probe": _file(root, "probe-2-threads.json", 10, 60),
        "log": _file(root, "demo-logs/ada.log", 100, 4 * DAY),
    }


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_inventory_lists_every_kind_with_sizes_oldest_first(tmp_path: Path) -> None:
    files = _cache(tmp_path)
    _file(tmp_path, "hashes.json", 10, 0)  # the source-hash index is not listed
    entries = inventory(tmp_path)
    assert {e.path for e in entries} == set(files.values())
    kinds = {e.path: e.kind for e in entries}
    assert kinds[files["part"]] == "delivery" and kinds[files["log"]] == "log" and kinds[files["new_stage"]] == "stage"
    assert [e.mtime for e in entries] == sorted(e.mtime for e in entries)
    assert next(e for e in entries if e.path == files["old_stage"]).size == 5000
    assert 2.9 * DAY < next(e for e in entries if e.path == files["old_stage"]).age_s(time.time()) < 3.1 * DAY


def test_prune_keeps_what_a_running_session_uses_and_fresh_probes(tmp_path: Path) -> None:
    files = _cache(tmp_path)
    with InUse(tmp_path) as use:  # this test's process is a running session
        use.add(files["old_stage"])
        gone = {e.path for e in prune(tmp_path)}
        assert gone == {files["new_stage"], files["delivered"], files["part"], files["old_probe"], files["log"]}
        assert files["old_stage"].is_file() and files["fresh_probe"].is_file()
    assert not use.record.exists() and not list((tmp_path / "in-use").iterdir())  # the list ends with the session
    assert {e.path for e in prune(tmp_path)} == {files["old_stage"]}
    assert not (tmp_path / "stages" / "abc").exists()  # the emptied model folder goes too


def test_a_dead_process_protects_nothing(tmp_path: Path) -> None:
    files = _cache(tmp_path)
    record = tmp_path / "in-use" / f"{_dead_pid()}.json"
    record.parent.mkdir()
    record.write_text(f'["{files["old_stage"].resolve()}"]')
    assert in_use(tmp_path) == set() and not record.exists()
    assert files["old_stage"] in {e.path for e in prune(tmp_path)}


def test_cap_removes_least_recently_used_first_and_skips_files_in_use(tmp_path: Path) -> None:
    files = _cache(tmp_path)  # 11120 bytes in all
    with InUse(tmp_path) as use:
        use.add(files["part"])  # the oldest file, but in use (and now just used)
        gone = [e.path for e in enforce_cap(tmp_path, 5000)]
    # oldest first: the log (4 d), the stage of 3 d; then 11120 - 5100 = 6020 > 5000: the 2-day delivery
    assert gone == [files["log"], files["old_stage"], files["delivered"]]
    assert sum(e.size for e in inventory(tmp_path)) <= 5000
    assert files["part"].is_file()


def test_model_copies_and_chunks_from_urls_are_listed_at_what_they_hold_and_pruned_whole(tmp_path: Path) -> None:
    model = write_random_gguf(tmp_path / "m.gguf", TEST_SHAPE, 6, tokenizer=False)
    manifest = model_manifest(tmp_path, model)
    store = ChunkStore(tmp_path / "cache" / "models", manifest)
    with model.open("rb") as f:
        for i in (0, 7, 20):
            start, end = manifest.span(i)
            f.seek(start)
            store.accept(i, f.read(end - start), "a URL")
    copy = _file(tmp_path / "cache", f"copies/{'c' * 64}.gguf", 3000, DAY)
    listed = {e.path: e for e in inventory(tmp_path / "cache")}
    assert listed[copy].kind == "copy" and listed[store.part].kind == "chunks"
    # the sparse file counts the three chunks it holds, not the model's 35 MB
    assert 3 * manifest.chunk_size <= listed[store.part].size < 6 * manifest.chunk_size < manifest.size
    assert store.sidecar not in listed  # the bitmap is part of the chunks, not an entry of its own
    with InUse(tmp_path / "cache") as use:  # a member fetching into the store
        use.add(store.part)
        assert {e.path for e in prune(tmp_path / "cache")} == {copy}
    assert {e.path for e in prune(tmp_path / "cache")} == {store.part}
    assert not list((tmp_path / "cache" / "models").iterdir())  # its bitmap and lock file went with it

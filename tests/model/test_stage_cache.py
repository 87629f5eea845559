"""The stage cache is this user's alone (issue 34 item 10): stages found in it are loaded by name without
hashing them again, so a cache directory another user can write would let that user plant a stage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kafila.errors import CacheError
from kafila.model.stage_cache import StageCache

pytestmark = pytest.mark.fast


def test_a_new_cache_directory_is_private(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "new" / "cache")
    assert cache.root.is_dir() and cache.root.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777, 0o757])
def test_a_cache_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(CacheError, match=rf"{shared} can be written by other users \(mode {mode & 0o777:o}\); "
                                         rf"make it private \(chmod 700 {shared}\)"):
        StageCache(shared)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_cache_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    with pytest.raises(CacheError, match="belongs to another user"):
        StageCache(theirs)


def test_a_readable_cache_of_ones_own_is_kept_as_it_is(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    mine.chmod(0o755)
    assert StageCache(mine).root == mine and mine.stat().st_mode & 0o777 == 0o755

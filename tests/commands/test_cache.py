"""`kafila cache` as a user runs it, on a temporary cache and config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_kafila
from tests.session.delivery.test_cache_inventory import _cache

pytestmark = pytest.mark.fast


def test_lists_then_prunes_down_to_the_cap(tmp_path: Path) -> None:
    files = _cache(tmp_path / "cache")
    config = tmp_path / "config.toml"
    config.write_text("cache_max_gb = 5e-9  # 5 bytes\n")
    env = {"KAFILA_CACHE_DIR": str(tmp_path / "cache"), "KAFILA_CONFIG": str(config)}
    listed = run_kafila("cache", env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if "body-0-10.gguf" in x)
    assert line.split()[:2] == ["stage", "0.0"] and "3 d old" in line
    assert "7 files, 0.0 MB (cap 5e-09 GB)" in listed.stdout
    pruned = run_kafila("cache", "--prune", "--json", env=env, timeout=60)
    report = json.loads(pruned.stdout)
    # --prune keeps the fresh probe, but it does not fit under the 5-byte cap
    assert report["entries"] == [] and report["total_bytes"] == 0 and report["cap_bytes"] == 5
    assert [Path(e["path"]) for e in report["removed"]][-1] == files["fresh_probe"]
    assert len(report["removed"]) == 7


def test_a_malformed_config_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    for text, what in (("cache_max_gb = -1\n", "cache_max_gb must be a positive number"),
                       ("cache_max_gb = [\n", "cannot read it"),
                       ("cache_size = 3\n", "unknown setting cache_size")):
        config.write_text(text)
        r = run_kafila("cache", "--prune", env={"KAFILA_CACHE_DIR": str(tmp_path / "c"), "KAFILA_CONFIG": str(config)},
                       timeout=60)
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.startswith(f"kafila: error: config file {config}: ") and what in r.stderr
        assert r.stderr.count("\n") == 1

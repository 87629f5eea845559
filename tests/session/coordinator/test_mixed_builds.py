"""A ring with one member on a second, real llama.cpp build (GGML_NATIVE=ON): refused by default,
admitted with --mixed-builds, and `kafila bench mixed` reports its agreement with the exact ring.

The second build takes ~10 minutes on 2 cores. It is cached in the user cache directory; this test
is skipped only when it is not cached and this is not CI (CI builds it: `make llama-variant`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafila.engine.variant import build, is_built, variant_dir
from tests.conftest import in_ci, run_kafila
from tests.shared_probe import shared_probe_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]


@pytest.fixture(scope="module")
def second_build() -> Path:
    path = variant_dir()
    if not is_built(path):
        if not in_ci():
            pytest.skip("the second llama.cpp build is not cached: `make llama-variant` builds it (~10 min)")
        build(path)
    return path


def test_a_member_on_another_build_is_refused_then_admitted_with_mixed_builds(second_build: Path,
                                                                             tmp_path: Path) -> None:
    shared_probe_model(tmp_path / "cache")
    out = run_kafila("bench", "mixed", "--json", "--tokens", "16", "--out", str(tmp_path / "mixed.json"),
                     env={"KAFILA_CACHE_DIR": str(tmp_path / "cache")}, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["builds"]["this"] != doc["builds"]["second"]
    note = doc["refused_without_mixed_builds"]
    assert "llama.cpp libraries" in note and "--mixed-builds" in note, note
    assert doc["exact"]["builds"]["mode"] == "exact" and doc["exact"]["builds"]["differ"] == {}
    mixed = doc["mixed"]["builds"]
    assert mixed["mode"] == "mixed" and not mixed["bit_exact"] and list(mixed["differ"]) == ["bo"]
    assert sorted(doc["mixed"]["order"]) == ["ada", "bo"]
    assert all(p["mixed"].strip() for p in doc["per_prompt"])  # the mixed ring replied to every prompt
    a = doc["agreement"]
    assert 0 < a["equal_prefix_tokens"] <= a["exact_tokens"]  # same model: at least the first tokens agree
    assert doc["exact"]["tokens_per_s"] > 0 and doc["mixed"]["tokens_per_s"] > 0

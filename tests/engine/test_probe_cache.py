"""The probe cache the README promises: a machine's measurement is reused for a day, and only by the same build.

One real probe writes the cache; every later call is given a model path that does not exist, so a call
that measures again fails, and one that reuses the cache does not.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kafila.engine.probe_cache import cached_probe
from kafila.errors import KafilaError
from kafila.model.random_gguf import TEST_SHAPE
from kafila.model.stage_cache import StageCache

pytestmark = pytest.mark.slow

DAY_S = 24 * 3600  # README: "measures itself (cached for a day)"


@pytest.fixture(scope="module")
def measured(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[StageCache, object, Path]:
    cache = StageCache(tmp_path_factory.mktemp("probe-cache"))
    result = cached_probe(smollm, cache, large_shape=TEST_SHAPE)
    files = list(cache.root.glob("probe-*.json"))
    assert len(files) == 1, files
    return cache, result, files[0]


def edit(path: Path, **changes: object) -> dict[str, object]:
    """Change fields of the saved probe (as time passing, or another build, would); returns the original."""
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, **changes}))
    return dict(saved)


def no_model(tmp_path: Path) -> Path:
    return tmp_path / "no-such-model.gguf"


def probes_again(cache: StageCache, tmp_path: Path, fresh: bool = False) -> bool:
    """Whether cached_probe measures again (it then needs the model, which is not there)."""
    try:
        cached_probe(no_model(tmp_path), cache, fresh=fresh)
    except (KafilaError, OSError):
        return True
    return False


def test_a_recent_probe_of_this_build_is_reused_as_measured(measured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache, result, _ = measured
    assert cached_probe(no_model(tmp_path), cache) == result  # read back field for field


def test_a_probe_older_than_a_day_is_measured_again(measured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache, _, path = measured
    saved = edit(path, time=time.time() - DAY_S + 600)
    try:
        assert not probes_again(cache, tmp_path)  # 23 h 50 min old: still good
        edit(path, time=time.time() - DAY_S - 600)
        assert probes_again(cache, tmp_path)
    finally:
        path.write_text(json.dumps(saved))


def test_a_probe_from_another_build_is_measured_again(measured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache, _, path = measured
    saved = edit(path, build="llama.cpp 0000000 some other build")
    try:
        assert probes_again(cache, tmp_path)
    finally:
        path.write_text(json.dumps(saved))


def test_fresh_always_measures_and_a_damaged_cache_is_measured_again(measured, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache, _, path = measured
    assert probes_again(cache, tmp_path, fresh=True)
    saved = path.read_text()
    try:
        path.write_text("{not json")
        assert probes_again(cache, tmp_path)
    finally:
        path.write_text(saved)


def test_the_per_block_time_travels_to_the_planner(measured) -> None:  # type: ignore[no-untyped-def]
    # probe → announcement measurements (emulated slow-down applied) → the host's planner Member
    import json as js

    from kafila.net.trust import MAX_ANNOUNCEMENT, VerifiedMember
    from kafila.planner import NatClass
    from kafila.session.coordinator.planning import planner_member
    from kafila.session.protocol.announcement import Emulation, measurements

    _, result, _ = measured
    meas = measurements(result, Emulation(throttle=2.0))
    four_digits = {"rel": 5e-4}  # the announcement carries 4 significant digits (announcement._sig)
    assert meas["blk"] == pytest.approx(result.block_s * 2.0, **four_digits)
    assert meas["disp"] == pytest.approx(result.dispatch_s * 2.0, **four_digits)
    assert len(js.dumps(meas)) < MAX_ANNOUNCEMENT
    vm = VerifiedMember(b"\0" * 8, "m", b"", NatClass.ORDINARY, None, None, None, 5.0, meas)
    member = planner_member(vm)
    assert member.block_s == meas["blk"] and member.dispatch_s == meas["disp"]
    assert member.bandwidth == round(result.bandwidth_bytes_per_s / 2.0)
    # the routed experts' prefill rate of each type the probe learned, slowed alike
    rates = [(kind, rate) for kind, rate in result.expert_rates if rate > 0]
    assert dict(member.prefill_expert_rates) == {kind: round(rate / 2.0) for kind, rate in rates}

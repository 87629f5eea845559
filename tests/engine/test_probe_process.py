"""The probe in a process of its own: a llama.cpp crash on the mixture-of-experts blocks (as some builds
have, llama.cpp #20824) costs the member its expert rates, not its join.

The crash is a real SIGSEGV of the spawned child (the AMX build that crashes cannot run here);
the probe itself is a made-up result, so the tests take two process starts each."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kafila.engine.probe import EXPERT_SHAPES, ProbeResult
from kafila.engine.probe_process import probe_isolated
from kafila.errors import EngineError
from kafila.model.stage_cache import StageCache
from tests.shared_probe import sample_probe

pytestmark = pytest.mark.fast


def crashes_on_experts(model: Path, cache: StageCache, on_step: Any = None,
                       expert_shapes: tuple[Any, ...] = EXPERT_SHAPES, **_: Any) -> ProbeResult:
    """A probe that segfaults where a broken build would (its MoE blocks), else a made-up result."""
    on_step("timing decode calls", 1, 2)
    if expert_shapes:
        os.kill(os.getpid(), signal.SIGSEGV)
    return sample_probe()


def always_crashes(model: Path, cache: StageCache, **_: Any) -> ProbeResult:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def hangs_on_experts(model: Path, cache: StageCache, on_step: Any = None,
                     expert_shapes: tuple[Any, ...] = EXPERT_SHAPES, **_: Any) -> ProbeResult:
    if expert_shapes:
        time.sleep(3600)
    return sample_probe()


def refuses(model: Path, cache: StageCache, **_: Any) -> ProbeResult:
    raise EngineError("probing needs at least two different cut sizes")


def test_a_crash_on_the_expert_blocks_probes_again_without_them(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    steps: list[tuple[str, int, int]] = []
    got = probe_isolated(tmp_path / "m.gguf", StageCache(tmp_path), lambda *s: steps.append(s),
                         measure=crashes_on_experts, threads=1)
    assert got == sample_probe()  # the child's result, through the pipe
    assert steps == [("timing decode calls", 1, 2)] * 2  # both children's progress reached the caller
    assert "the probe failed (killed by SIGSEGV)" in caplog.text


def test_a_probe_that_crashes_without_experts_too_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"failed twice \(killed by SIGSEGV; then .* killed by SIGSEGV\)"):
        probe_isolated(tmp_path / "m.gguf", StageCache(tmp_path), measure=always_crashes)


def test_a_probe_that_hangs_on_the_expert_blocks_is_killed_and_probed_again_without_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t0 = time.monotonic()
    assert probe_isolated(tmp_path / "m.gguf", StageCache(tmp_path), measure=hangs_on_experts,
                          stall_s=2.0) == sample_probe()
    assert "the probe failed (no progress for 2 s)" in caplog.text
    assert time.monotonic() - t0 < 60  # the hung child was not waited for


def test_the_probes_own_errors_reach_the_caller_unchanged(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="at least two different cut sizes"):
        probe_isolated(tmp_path / "m.gguf", StageCache(tmp_path), measure=refuses)

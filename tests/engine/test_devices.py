"""GPU offload decisions from device facts (no GPU here: fake facts), and the real CPU build's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.engine.devices import ALL_LAYERS, Device, choose_offload, devices, plan_offload, stage_need_bytes
from kafila.engine.probe import offload_memory
from kafila.engine.stage import ContextConfig, StageEngine
from kafila.model.cut import StageSpec
from kafila.model.stage_cache import StageCache

pytestmark = pytest.mark.fast

GB = 10**9
CPU = Device("CPU", "cpu", 16 * GB, 32 * GB)
CUDA = Device("CUDA0", "gpu", 8 * GB, 24 * GB)
CUDA_BIG = Device("CUDA1", "gpu", 20 * GB, 24 * GB)
METAL = Device("Metal", "igpu", 12 * GB, 16 * GB)


def test_a_stage_that_fits_goes_wholly_on_the_gpu_with_most_free_memory() -> None:
    o = choose_offload(True, [CPU, CUDA, CUDA_BIG], 10 * GB)
    assert (o.n_gpu_layers, o.device, o.device_free_bytes) == (ALL_LAYERS, "CUDA1", 20 * GB)
    assert "all layers on CUDA1" in o.reason


def test_an_integrated_gpu_counts_too() -> None:
    assert choose_offload(True, [CPU, METAL], 2 * GB).device == "Metal"


def test_a_stage_that_does_not_fit_stays_on_the_cpu_and_says_by_how_much() -> None:
    o = choose_offload(True, [CPU, CUDA], int(7.5 * GB))  # 8 GB free, less the margin: 7.2 GB to spare
    assert o.n_gpu_layers == 0 and o.device is None
    assert o.reason == "the stage needs 7500 MB, CUDA0 has 7200 MB to spare"


def test_no_gpu_backend_no_gpu_device_or_turned_off_means_cpu() -> None:
    assert choose_offload(False, [CPU, CUDA], GB).reason == "this llama.cpp build has no GPU backend"
    assert choose_offload(True, [CPU], GB).reason == "llama.cpp found no GPU device"
    assert choose_offload(True, [CUDA], GB, allowed=False).n_gpu_layers == 0
    assert offload_memory(choose_offload(True, [CPU], GB)) == (None, None)
    assert offload_memory(choose_offload(True, [CUDA], GB)) == ("CUDA0", 8 * GB)  # the probe's memory then


def test_this_cpu_build_lists_its_cpu_and_keeps_stages_on_it(smollm: Path, stage_cache: StageCache) -> None:
    devs = devices()
    assert devs and devs[0].kind == "cpu" and 0 < devs[0].free_bytes <= devs[0].total_bytes
    stage = stage_cache.stage(smollm, StageSpec(0, 2, head=False))
    assert stage_need_bytes(stage, 1024) > stage.stat().st_size  # weights and the KV cache
    assert plan_offload(stage, 1024).reason == "this llama.cpp build has no GPU backend"
    with StageEngine(stage, ContextConfig(n_ctx_per_seq=256, n_seq_max=1, n_batch=8), final=False) as engine:
        assert engine.offload.n_gpu_layers == 0

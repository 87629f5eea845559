"""GPU offload: which of llama.cpp's devices a stage goes on, and whether it fits there.

A member whose llama.cpp has a GPU backend (CUDA, Metal, Vulkan, ROCm) loads its whole stage onto
the GPU with the most free memory when the stage's weights and KV cache fit there; otherwise, and
on CPU-only builds, it stays on the CPU. The decision is a pure function of device facts
(`choose_offload`), so it is tested without a GPU; `devices()` reads the facts from ggml.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

# enum ggml_backend_dev_type (ggml-backend.h): CPU, GPU, IGPU (integrated: host memory), ACCEL, META
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
OFFLOAD_KINDS = ("gpu", "igpu")
DEVICE_MARGIN = 0.10  # of a device's free memory, left for compute buffers and other programs
ALL_LAYERS = 999  # llama.cpp's n_gpu_layers caps this at the model's layers (+ the output layer)


@dataclass(frozen=True)
class Device:
    """One llama.cpp backend device and its memory now."""

    name: str
    kind: str  # one of DEVICE_KINDS' values
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Offload:
    """Where a stage goes: n_gpu_layers for llama.cpp, the device, and why (one line)."""

    n_gpu_layers: int
    device: str | None
    device_free_bytes: int | None
    reason: str


def choose_offload(supports_gpu: bool, devices: list[Device], need_bytes: int, allowed: bool = True) -> Offload:
    """All layers on the GPU with the most free memory when `need_bytes` fit in it, else none."""
    if not allowed:
        return Offload(0, None, None, "offload is turned off")
    if not supports_gpu:
        return Offload(0, None, None, "this llama.cpp build has no GPU backend")
    gpus = [d for d in devices if d.kind in OFFLOAD_KINDS]
    if not gpus:
        return Offload(0, None, None, "llama.cpp found no GPU device")
    best = max(gpus, key=lambda d: d.free_bytes)
    room = int(best.free_bytes * (1 - DEVICE_MARGIN))
    if need_bytes > room:
        return Offload(0, None, best.free_bytes,
                       f"the stage needs {need_bytes / 1e6:.0f} MB, {best.name} has {room / 1e6:.0f} MB to spare")
    return Offload(ALL_LAYERS, best.name, best.free_bytes,
                   f"all layers on {best.name} ({need_bytes / 1e6:.0f} MB of {room / 1e6:.0f} MB)")


def stage_need_bytes(path: Path, n_ctx: int) -> int:
    """What a stage holds on its device: its weights (the file) and the KV cache of `n_ctx` tokens."""
    from kafila.model.describe import describe_model

    kv_per_token = sum(describe_model(path).kv_bytes_per_token)
    return Path(path).stat().st_size + kv_per_token * n_ctx


def devices() -> list[Device]:
    """llama.cpp's backend devices, with their free and total memory now."""
    from kafila.engine.llama_lib import ggml

    g = ggml()  # libggml resolves the libggml-base functions it depends on
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_dev_get.argtypes, g.ggml_backend_dev_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    g.ggml_backend_dev_name.argtypes, g.ggml_backend_dev_name.restype = [ctypes.c_void_p], ctypes.c_char_p
    g.ggml_backend_dev_type.argtypes, g.ggml_backend_dev_type.restype = [ctypes.c_void_p], ctypes.c_int
    g.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(ctypes.c_size_t)]
    g.ggml_backend_dev_memory.restype = None
    out = []
    for i in range(int(g.ggml_backend_dev_count())):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device((g.ggml_backend_dev_name(dev) or b"?").decode(errors="replace"),
                          DEVICE_KINDS.get(int(g.ggml_backend_dev_type(dev)), "other"), int(free.value),
                          int(total.value)))
    return out


def plan_offload(path: Path, n_ctx: int, allowed: bool = True) -> Offload:
    """The offload decision for a stage file on this machine's llama.cpp."""
    from kafila.engine.llama_lib import llama

    supports = bool(llama().llama_supports_gpu_offload())
    if not (allowed and supports):  # skip reading the file and devices: the answer is "CPU" anyway
        return choose_offload(supports, [], 0, allowed)
    return choose_offload(True, devices(), stage_need_bytes(path, n_ctx), allowed)

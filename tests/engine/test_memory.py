"""Memory facts where /proc, sysconf or both are missing (macOS, Windows), simulated on this machine."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kafila.engine import memory
from kafila.errors import EngineError

pytestmark = pytest.mark.fast


def meminfo_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def test_linux_reads_memavailable() -> None:
    assert abs(memory.available_memory() - meminfo_available()) < 256 << 20  # it moves a little between reads


def test_without_proc_half_the_physical_memory_counts(tmp_path: Path) -> None:
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.available_memory(tmp_path / "no-proc") == total // 2


def test_without_proc_or_sysconf_the_error_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sysconf")
    with pytest.raises(EngineError, match="no /proc/meminfo and no sysconf"):
        memory.available_memory(tmp_path / "no-proc")


def test_windows_asks_global_memory_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def status(ref: Any) -> int:
        struct = ref._obj  # what ctypes.byref points at
        assert struct.dwLength == ctypes.sizeof(struct)
        struct.ullAvailPhys = 3 << 30
        return 1

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(ctypes, "windll", SimpleNamespace(kernel32=SimpleNamespace(GlobalMemoryStatusEx=status)),
                        raising=False)
    assert memory.available_memory(tmp_path / "no-proc") == 3 << 30


def test_without_proc_resident_memory_is_the_peak_from_getrusage(tmp_path: Path) -> None:
    now = memory.resident_memory()
    assert now > 10 << 20  # a Python process with numpy loaded
    peak = memory.resident_memory(tmp_path / "no-proc")
    # the peak, in bytes (getrusage counts KiB on Linux); the kernel updates its high-water mark lazily
    assert 0.8 * now <= peak < 64 * now

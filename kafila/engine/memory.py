"""This machine's memory facts for the probe, on Linux, macOS and Windows.

Each fact is read the most exact way the OS offers, falling back where that is missing: /proc on
Linux, sysconf on other POSIX systems, the Win32 API on Windows.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from kafila.errors import EngineError

PROC = Path("/proc")


def available_memory(proc: Path = PROC) -> int:
    """Bytes a new process can use without swapping."""
    try:
        with (proc / "meminfo").open() as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    if sys.platform == "win32":
        return _windows_memory_status()
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        raise EngineError("cannot tell this machine's memory: no /proc/meminfo and no sysconf") from None
    # No count of reclaimable memory here (macOS has no SC_AVPHYS_PAGES, and its free pages leave out
    # the file cache it would give up): count half of physical memory, as a cautious guess.
    return int(total // 2)


def _windows_memory_status() -> int:
    class MemoryStatusEx(ctypes.Structure):
        _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                    ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                    ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                    ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                    ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

    status = MemoryStatusEx()
    status.dwLength = ctypes.sizeof(MemoryStatusEx)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
        raise EngineError("cannot tell this machine's memory: GlobalMemoryStatusEx failed")
    return int(status.ullAvailPhys)


def resident_memory(proc: Path = PROC) -> int:
    """This process's resident set size in bytes (its peak where only that is known; 0 where unknown)."""
    try:
        with (proc / "self" / "statm").open() as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS counts bytes, the others KiB

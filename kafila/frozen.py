"""The one-file binary's Python process ends when PyInstaller's bootloader (its parent) is killed.

The bootloader passes SIGTERM and SIGINT on, but a SIGKILL ends only the bootloader and would
orphan this process and everything it started (a demo's members). What the bootloader unpacked
stays in the temporary directory then: it is the bootloader's to remove.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1


def follow_bootloader() -> None:
    """In the one-file binary on Linux: have the kernel send this process SIGTERM when its parent dies."""
    meipass = getattr(sys, "_MEIPASS", None)
    if meipass is None or not Path(meipass).name.startswith("_MEI") or not sys.platform.startswith("linux"):
        return  # not the one-file binary: there is no bootloader
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)

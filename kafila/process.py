"""A Kafila process does not outlive the process it belongs to.

* The one-file binary's Python process is a child of PyInstaller's bootloader. The bootloader
  passes SIGTERM and SIGINT on, but a SIGKILL ends only the bootloader; the kernel is asked to
  send this process SIGTERM when its parent dies. (What the bootloader unpacked then stays in
  the temporary directory: it is the bootloader's to remove.)
* A process started by another Kafila process (a demo's rendezvous and members) is told that
  process's pid in KAFILA_PARENT_PID and watches it, so a killed demo leaves nothing running.
  (It watches the pid rather than relying on the kernel: from the binary, a bootloader stands
  between the two.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

PARENT_ENV = "KAFILA_PARENT_PID"
PR_SET_PDEATHSIG = 1
WATCH_EVERY_S = 1.0


def follow_parent() -> None:
    """Arrange SIGTERM for this process when the process it belongs to is gone (see the module's note)."""
    _follow_bootloader()
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit():
        threading.Thread(target=_watch, args=(int(parent),), name="kafila-parent-watch", daemon=True).start()


def _follow_bootloader() -> None:
    meipass = getattr(sys, "_MEIPASS", None)
    if meipass is None or not Path(meipass).name.startswith("_MEI") or not sys.platform.startswith("linux"):
        return  # not the one-file binary: there is no bootloader
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a killed process its parent has not reaped yet is gone too


def _watch(pid: int) -> None:
    while _alive(pid):
        time.sleep(WATCH_EVERY_S)
    os.kill(os.getpid(), signal.SIGTERM)

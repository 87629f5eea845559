"""A Kafila process does not outlive the process it belongs to.

* The one-file binary's Python process is a child of PyInstaller's bootloader. The bootloader
  passes SIGTERM and SIGINT on, but a SIGKILL ends only the bootloader; the kernel is asked to
  send this process SIGTERM when its parent dies (Linux's prctl; where there is none, macOS and
  Windows, it watches the bootloader's pid instead). (What the bootloader unpacked then stays in
  the temporary directory: it is the bootloader's to remove.)
* A process started by another Kafila process (a demo's rendezvous and members) is told that
  process's pid in KAFILA_PARENT_PID and watches it, so a killed demo leaves nothing running.
  (It watches the pid rather than relying on the kernel: from the binary, a bootloader stands
  between the two.) The watch reads /proc where there is one, else asks the OS about the pid.
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
PROC = Path("/proc")


def follow_parent() -> None:
    """Arrange SIGTERM for this process when the process it belongs to is gone (see the module's note)."""
    _follow_bootloader()
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit():
        _start_watch(int(parent))


def _follow_bootloader() -> None:
    meipass = getattr(sys, "_MEIPASS", None)
    if meipass is None or not Path(meipass).name.startswith("_MEI"):
        return  # not the one-file binary: there is no bootloader
    parent = os.getppid()
    if not request_parent_death_signal():
        _start_watch(parent)  # no prctl (macOS, Windows): watch the bootloader instead
    elif os.getppid() != parent:  # it died before the request took effect
        end_self()


def request_parent_death_signal() -> bool:
    """Ask the kernel for SIGTERM when the parent dies; False where there is no prctl (only Linux has it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without it
        return False
    return bool(prctl(PR_SET_PDEATHSIG, signal.SIGTERM) == 0)


def _start_watch(pid: int) -> None:
    threading.Thread(target=_watch, args=(pid,), name="kafila-parent-watch", daemon=True).start()


def alive(pid: int, proc: Path | None = None) -> bool:
    """Whether process `pid` still runs: from /proc where there is one, else by asking the OS."""
    proc = PROC if proc is None else proc
    if proc.is_dir():
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2] != "Z"  # a killed process its parent has not reaped yet is gone too
    if sys.platform == "win32":
        return _alive_windows(pid)
    try:
        os.kill(pid, 0)  # signal 0 checks the pid without sending anything (POSIX only: on Windows it kills)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process by that pid: it exists
        pass
    return True  # (a zombie looks alive here: _watch also notices when its parent changes)


def _alive_windows(pid: int) -> bool:
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return False
    try:
        code = ctypes.c_ulong()
        return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def end_self() -> None:
    """SIGTERM to this process, so its handler ends it in order (Windows has no kill(2): raise it here)."""
    if sys.platform == "win32":
        signal.raise_signal(signal.SIGTERM)
    else:
        os.kill(os.getpid(), signal.SIGTERM)


def _watch(pid: int) -> None:
    was_parent = os.getppid() == pid
    # a parent that died has handed this process to another, even while it is an unreaped zombie
    while alive(pid) and not (was_parent and os.getppid() != pid):
        time.sleep(WATCH_EVERY_S)
    end_self()

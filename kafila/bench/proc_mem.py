"""Resident memory of this process and its children, read from /proc (Linux), for benchmark reports."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


def status_kb(pid: int, key: str) -> int | None:
    """A `kB` figure of /proc/PID/status (VmRSS: now, VmHWM: the peak), None when the process is gone."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak(pid: int | None = None) -> bool:
    """Start VmHWM afresh (Linux ≥ 4.0: writing 5 to clear_refs); False where not allowed."""
    try:
        (PROC / str(pid or os.getpid()) / "clear_refs").write_text("5")
        return True
    except OSError:
        return False


def children(pid: int | None = None) -> dict[int, str]:
    """Direct children of `pid` (default: this process): pid -> a label from the command line.

    A `kafila join --name X` child is labelled X; any other `kafila SUBCOMMAND` by its subcommand."""
    parent = pid or os.getpid()
    found: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != parent:
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        found[int(entry.name)] = _label(argv)
    return found


def _label(argv: list[str]) -> str:
    if "--name" in argv and argv.index("--name") + 1 < len(argv):
        return argv[argv.index("--name") + 1]
    for word in ("rendezvous", "join", "host"):
        if word in argv:
            return word
    return Path(argv[0]).name if argv and argv[0] else "?"


@dataclass
class RssSampler:
    """Samples every child's VmRSS on a thread; `window(label)` peaks are taken while `in_window(label)` holds.

    It reads /proc only while `active()` holds: a scan takes ~5 ms of a core, and one every 50 ms
    slowed the ring it measured on a 2-core machine (two of three stages 10 % and 14 % in an A/B).
    """

    in_window: Callable[[str], bool]
    active: Callable[[], bool] = lambda: True
    period_s: float = 0.05
    labels: dict[int, str] = field(default_factory=dict)
    first_kb: dict[str, int] = field(default_factory=dict)  # each child's RSS when first seen in its window
    window_peak_kb: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if not self.active():
                continue
            self.labels.update(children())
            for pid, label in list(self.labels.items()):
                if not self.in_window(label):
                    continue
                kb = status_kb(pid, "VmRSS")
                if kb is None:
                    continue
                self.first_kb.setdefault(label, kb)
                self.window_peak_kb[label] = max(self.window_peak_kb.get(label, 0), kb)

    def peaks_kb(self) -> dict[str, int]:
        """Every child's peak RSS so far (VmHWM), by label, while they still run."""
        self.labels.update(children())
        return {label: kb for pid, label in self.labels.items() if (kb := status_kb(pid, "VmHWM")) is not None}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

"""Stages on one machine take turns on its cores.

Two stages computing at once on one machine (members started side by side, as the demo does) each run
llama.cpp's threads on all cores: the threads of both preempt each other at every barrier, and a
pipelined prompt's chunks took longer than one stage after another would (on 2 cores, a slowed ring's
TTFT was 1.18× the unpipelined sum). Taking turns makes the machine compute one call at a time at its
full speed, which is what the planner's TTFT model assumes of stages sharing a machine; an emulated
slow-down's sleep is outside the turn, so it overlaps other stages' compute as a slower machine would.

The turn is an exclusive `flock` on a file in the cache directory (members of one demo share it); the
kernel drops it when a process dies, so a killed member never leaves it held.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

TURN_FILE = "compute.lock"


class ComputeTurn:
    """An exclusive turn on this machine's cores, held for one llama.cpp call (`with turn: ...`)."""

    def __init__(self, cache_root: Path) -> None:
        cache_root.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(cache_root / TURN_FILE, os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self) -> ComputeTurn:
        assert self._fd is not None, "the turn was closed"
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def try_take(self) -> bool:
        """Take the turn if no other stage holds it, without waiting; True when taken (then `release` it)."""
        assert self._fd is not None, "the turn was closed"
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

"""File work (cutting a stage, hashing it) on a worker thread that stops when the task awaiting it is cancelled.

asyncio.to_thread alone cannot stop its thread: a cancelled await leaves the work running, and
asyncio.run's exit waits for the default executor's threads, so a SIGTERM while the host cut a
stage of a big model waited for the whole cut (past the CLI's stop deadline, for a large one).
Here the work is handed a progress callback that raises WorkStopped once the await has been
cancelled; the work calls it between pieces (a tensor, a chunk of hashing) and cleans up as the
exception passes, so the executor's thread ends within one piece.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from kafila.errors import WorkStopped

T = TypeVar("T")
Progress = Callable[[int, int], None]  # (bytes done, total); raises WorkStopped once stopped


async def run_stoppable(work: Callable[[Progress], T]) -> T:
    """`work(progress)` on a worker thread; cancelling this await stops it at its next progress call."""
    stop = threading.Event()

    def progress(done: int, total: int) -> None:
        if stop.is_set():
            raise WorkStopped(f"stopped after {done} of {total} bytes: the session is ending")

    try:
        return await asyncio.to_thread(work, progress)
    except asyncio.CancelledError:
        stop.set()
        raise

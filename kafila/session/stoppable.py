"""File work (cutting a stage, hashing it) on a worker thread that stops when the task awaiting it is cancelled.

asyncio.to_thread alone cannot stop its thread: a cancelled await leaves the work running, and
asyncio.run's exit waits for the default executor's threads, so a SIGTERM while the host cut a
stage of a big model waited for the whole cut (past the CLI's stop deadline, for a large one).
Here the work is handed a progress callback that raises WorkStopped once the process is asked to
stop (at once, as the SIGTERM handler sets it: kafila.stopping) or the await has been cancelled; the
work calls it between pieces (a few MiB of a tensor, a chunk of hashing) and cleans up as the
exception passes, so the executor's thread ends within one piece.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from kafila.errors import WorkStopped
from kafila.stopping import stop_request

T = TypeVar("T")
Progress = Callable[[int, int], None]  # (bytes done, total); raises WorkStopped once stopped


async def run_stoppable(work: Callable[[Progress], T]) -> T:
    """`work(progress)` on a worker thread; a SIGTERM or cancelling this await stops it at its next progress call."""
    stop, asked = threading.Event(), stop_request()

    def progress(done: int, total: int) -> None:
        if asked.requested or stop.is_set():
            raise WorkStopped(f"stopped after {done} of {total} bytes: the session is ending")

    try:
        return await asyncio.to_thread(work, progress)
    except asyncio.CancelledError:
        stop.set()
        raise
    except WorkStopped:
        if asked.requested:  # the SIGTERM stopped the work before the flow's cancellation came down to this
            raise asyncio.CancelledError from None  # await: it ends as that cancellation ends it, not as an error
        raise

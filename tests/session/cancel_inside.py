"""A run_stoppable await cancelled while its work is inside a piece, for the tests of stopping work."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from kafila.session.stoppable import Progress, run_stoppable


async def cancel_inside(work: Callable[[Progress], object], inside: threading.Event, go_on: threading.Event,
                        ended: threading.Event) -> None:
    """Await run_stoppable(work) and cancel the await once the work sets `inside`: the await ends cancelled at
    once. Then let the work go on (`go_on`, which it waits on inside) and wait until it sets `ended`."""
    task = asyncio.ensure_future(run_stoppable(work))
    assert await asyncio.to_thread(inside.wait, 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    go_on.set()
    assert await asyncio.to_thread(ended.wait, 60)

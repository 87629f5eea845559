"""A member's word to the host that it is still working on a step the host cannot watch.

The host bounds its wait for a member's stage by progress, not by a fixed time (kafila.session.coordinator.machine):
bytes of the stage moving are progress it sees itself; verifying, cutting, loading into llama.cpp and
opening ring edges are not, so the member says which of them it is doing, now and every EVERY_S.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from kafila.errors import NetworkError
from kafila.session.protocol import messages

EVERY_S = 1.0  # well inside any stall limit a host sets (default SessionSettings.stall_s)


@contextlib.asynccontextmanager
async def working(send: Callable[[messages.Control], Awaitable[None]], epoch: int,
                  step: str | Callable[[], str | None], every_s: float = EVERY_S,
                  held: Callable[[], int] | None = None) -> AsyncIterator[None]:
    """While the block runs, send `working` messages naming `step` (a callable: its current value; None sends
    nothing, e.g. while stage bytes arrive, which the host sees moving itself), and what `held` says."""
    now = step if callable(step) else (lambda: step)

    async def beat() -> None:
        while True:
            current = now()
            if current is not None:
                with contextlib.suppress(NetworkError):  # a lost host is the control loop's to see
                    await send(messages.Working(epoch, current, None if held is None else held()))
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""A session flow on its own thread and event loop, so a plain terminal program can talk to it meanwhile."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from rich.console import Console

from kafila.errors import SessionError
from kafila.session.state import SessionState
from kafila.session.terminal.printer import EventPrinter

SETTLED = ("admitted", "rejected", "closed")
STOP_TIMEOUT_S = 30.0


class SessionThread:
    """`with SessionThread(flow) as s: state = s.wait_settled()`; leaving the block stops the flow."""

    def __init__(self, flow: Callable[[SessionState], Awaitable[int]], console: Console | None = None) -> None:
        self.flow = flow
        self.state = SessionState()
        if console is not None:
            self.state.subscribe(EventPrinter(console))
        self._settled = threading.Event()
        self.state.subscribe(lambda s: self._settled.set() if s.phase in SETTLED else None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[int] | None = None
        self.result: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kafila-session", daemon=True)

    def _main(self) -> None:
        async def main() -> int:
            self._task = asyncio.current_task()  # type: ignore[assignment]
            return await self.flow(self.state)

        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self.result = loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # handed to the waiting thread, which raises it
            self.error = exc
        finally:
            loop.close()
            self._settled.set()

    def __enter__(self) -> SessionThread:
        self._thread.start()
        return self

    def wait_settled(self, timeout_s: float) -> SessionState:
        """Block until the session is admitted, rejected or over; raise what the flow raised."""
        if not self._settled.wait(timeout_s):
            raise SessionError(f"the session did not settle within {timeout_s:.0f} s (phase: {self.state.phase})")
        if self.error is not None:
            raise self.error
        return self.state

    def __exit__(self, *exc: object) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed in between
                pass
        self._thread.join(STOP_TIMEOUT_S)

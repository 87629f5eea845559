"""How a Kafila process stops on SIGTERM: in order, from its own awaits, and never much later than asked.

A SIGTERM raised as KeyboardInterrupt lands wherever the main thread happens to be. In an event
loop that may be the middle of a protocol callback or of a task's step, which leaves a future
never set, and the clean-up that awaits it hangs. So a session flow run in the main thread is
cancelled instead, as asyncio.run does for Ctrl-C: it unwinds from the await it is suspended in.
Whatever still gets stuck on the way out (a peer that vanished at the same moment), the deadline
cuts short, printing where every thread and task was.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
STOP_DEADLINE_S = 15.0  # after SIGTERM, the longest a stop may take before the process just exits


def start_deadline(loop: asyncio.AbstractEventLoop | None) -> None:
    """Past STOP_DEADLINE_S from now, print the threads' stacks (and `loop`'s tasks') and exit with status 1."""
    deadline = threading.Timer(STOP_DEADLINE_S, _stop_now, args=(loop,))
    deadline.daemon = True
    deadline.start()


async def cancelled_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` in this task; a SIGTERM cancels the task (KeyboardInterrupt once it has unwound)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        return await coro
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert task is not None
    stopped = threading.Event()

    def on_sigterm(_signum: int, _frame: object) -> None:
        if not stopped.is_set():
            stopped.set()
            start_deadline(loop)
        loop.call_soon_threadsafe(task.cancel)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return await coro
    except asyncio.CancelledError:
        if stopped.is_set():
            raise KeyboardInterrupt from None  # stopped as asked: ends as Ctrl-C does, status 130
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_now(loop: asyncio.AbstractEventLoop | None) -> None:
    print(f"kafila: stopping took over {STOP_DEADLINE_S:.0f} s; where it was:", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    if loop is not None:  # the threads show only the event loop waiting; the tasks show what it waits for
        try:
            for task in asyncio.all_tasks(loop):
                print(f"task {task.get_name()}:", file=sys.stderr)
                for where in _awaiting(task.get_coro()):
                    print(f"  {where}", file=sys.stderr)
        except Exception as exc:  # read from another thread while the loop runs: best effort
            print(f"(tasks not readable: {exc!r})", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def _awaiting(coro: object) -> list[str]:
    """The whole chain of awaits a coroutine is suspended in (a task's own stack shows only its top frame)."""
    chain = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return chain

"""How a Kafila process stops on SIGTERM: in order, from its own awaits, and never much later than asked.

A SIGTERM raised as KeyboardInterrupt lands wherever the main thread happens to be. In an event
loop that may be the middle of a protocol callback or of a task's step, which leaves a future
never set, and the clean-up that awaits it hangs. So a session flow run in the main thread is
cancelled instead, as asyncio.run does for Ctrl-C: it unwinds from the await it is suspended in.
Whatever still gets stuck on the way out (a peer that vanished at the same moment), the deadline
cuts short, printing where every thread and task was.

Work on worker threads (cutting a stage, hashing a model) reads the stop itself, between pieces, as
the handler set it (`stop_request`): a cancellation reaches the task awaiting that work only after the loop
has passed it down, and the work must not run on meanwhile.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import socket
import sys
import threading
from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
STOP_DEADLINE_S = 15.0  # after SIGTERM, the longest a stop may take before the process just exits


def start_deadline(loop: asyncio.AbstractEventLoop | None) -> None:
    """Past STOP_DEADLINE_S from now, print the threads' stacks (and `loop`'s tasks') and exit with status 1."""
    deadline = threading.Timer(STOP_DEADLINE_S, _stop_now, args=(loop,))
    deadline.daemon = True
    deadline.start()


class StopRequest:
    """Whether a SIGTERM asked this flow to stop. A plain flag, not a threading.Event: the handler runs
    between two bytecodes of the main thread and must take no lock that thread may be holding."""

    def __init__(self) -> None:
        self.requested = False


# The flow's stop request, seen by its tasks and by the worker threads they start (asyncio.to_thread runs
# the work in a copy of the awaiting task's context). None outside a flow run by cancelled_by_sigterm.
_STOP: ContextVar[StopRequest | None] = ContextVar("kafila_stop", default=None)


def stop_request() -> StopRequest:
    """The stop request of the flow this task runs in (one never set outside such a flow); read from any thread."""
    return _STOP.get() or StopRequest()


async def cancelled_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` in this task; a SIGTERM cancels the task (KeyboardInterrupt once it has unwound)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        return await coro
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert task is not None
    stop = StopRequest()

    def on_sigterm(_signum: int, _frame: object) -> None:
        if not stop.requested:
            stop.requested = True
            start_deadline(loop)
        loop.call_soon_threadsafe(task.cancel)

    # The kernel hands a process's signal to any of its threads that does not block it (after SIGCONT,
    # to whichever runs first), and Python runs the handler only in the main thread, at its next bytecode.
    # A main thread asleep in the loop's poll learnt of a SIGTERM taken by a worker thread only at the
    # loop's next timer: half a second, in which a stage cut wrote 300 MB. The wakeup socket, written from
    # whichever thread takes the signal, wakes the poll at once.
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    loop.add_reader(wake_r.fileno(), _drain, wake_r)
    previous_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    token = _STOP.set(stop)
    try:
        return await coro
    except asyncio.CancelledError:
        if stop.requested:
            raise KeyboardInterrupt from None  # stopped as asked: ends as Ctrl-C does, status 130
        raise
    finally:
        _STOP.reset(token)
        signal.signal(signal.SIGTERM, previous)
        signal.set_wakeup_fd(previous_fd)
        loop.remove_reader(wake_r.fileno())
        wake_r.close()
        wake_w.close()


def _drain(sock: socket.socket) -> None:
    """Empty the wakeup socket (its bytes only woke the loop; the handler itself does the work)."""
    try:
        while sock.recv(512):
            pass
    except BlockingIOError:
        pass


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

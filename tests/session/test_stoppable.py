"""run_stoppable: cancelling the await stops the worker thread's work at its next progress call."""

from __future__ import annotations

import threading

import pytest

from kafila.errors import WorkStopped
from kafila.session.stoppable import Progress, run_stoppable
from tests.session.cancel_inside import cancel_inside

pytestmark = pytest.mark.fast


async def test_a_cancelled_await_stops_the_work_at_its_next_progress_call() -> None:
    started, go_on, ended = threading.Event(), threading.Event(), threading.Event()
    pieces: list[int] = []
    outcome: list[BaseException] = []

    def work(progress: Progress) -> str:
        started.set()
        go_on.wait(60)  # the await is cancelled while the work is inside a piece
        try:
            for i in range(100):
                progress(i, 100)
                pieces.append(i)
            return "finished"
        except BaseException as exc:
            outcome.append(exc)
            raise
        finally:
            ended.set()

    await cancel_inside(work, started, go_on, ended)
    assert pieces == [] and len(outcome) == 1 and isinstance(outcome[0], WorkStopped)
    assert "the session is ending" in str(outcome[0])


async def test_work_not_cancelled_runs_to_its_end_and_returns() -> None:
    def work(progress: Progress) -> int:
        for i in range(10):
            progress(i, 10)
        return 42

    assert await run_stoppable(work) == 42

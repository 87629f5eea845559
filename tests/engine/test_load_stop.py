"""A stage load that is told to stop stops between tensors (real llama.cpp, a tiny random model).

The member loads its stage on a worker thread through run_stoppable; before, the load could not be
stopped, so a member told to stop while llama.cpp loaded a big stage waited for the whole load.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from kafila.engine.stage import ContextConfig, Rows, StageEngine
from kafila.errors import WorkStopped
from kafila.session.stoppable import Progress
from tests.session.cancel_inside import cancel_inside

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=64, n_seq_max=1, n_batch=8, n_threads=1)


def one_row(engine: StageEngine) -> np.ndarray:
    rows = Rows(np.zeros(1, np.int32), np.zeros(1, np.int32), np.ones(1, bool))
    return engine.run(np.full((1, engine.n_embd), 0.5, np.float32), rows)


def test_progress_runs_from_the_start_to_the_whole_file(synthetic_models: dict[str, Path]) -> None:
    path = synthetic_models["llama"]
    seen: list[tuple[int, int]] = []
    with StageEngine(path, CONFIG, final=False, progress=lambda d, t: seen.append((d, t))) as engine:
        with_progress = one_row(engine)
    size = path.stat().st_size
    assert len(seen) > 3 and {t for _, t in seen} == {size}
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[0][0] == 0 and seen[-1] == (size, size)
    with StageEngine(path, CONFIG, final=False) as plain:
        assert np.array_equal(one_row(plain), with_progress)


@pytest.mark.parametrize("stop_at", [1, 3, "last"])
def test_a_raising_progress_stops_the_load_there_and_raises(synthetic_models: dict[str, Path],
                                                            stop_at: int | str) -> None:
    path = synthetic_models["llama"]
    total_calls: list[int] = []
    StageEngine(path, CONFIG, final=False, progress=lambda d, t: total_calls.append(d)).close()
    k = len(total_calls) if stop_at == "last" else int(stop_at)  # "last": the check before the context
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == k:
            raise WorkStopped("stop here")

    with pytest.raises(WorkStopped, match="stop here"):
        StageEngine(path, CONFIG, final=False, progress=progress)
    assert len(calls) == k, f"the load went on after its progress raised ({len(calls)} calls, stopped at {k})"
    with StageEngine(path, CONFIG, final=False) as engine:  # llama.cpp is left able to load again
        assert one_row(engine).shape == (1, engine.n_embd)


async def test_a_cancelled_load_through_run_stoppable_ends_its_thread(synthetic_models: dict[str, Path]) -> None:
    """As the member loads: cancelling the await stops llama.cpp's load at its next tensor."""
    path = synthetic_models["llama"]
    inside, go_on, ended = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []
    outcome: list[BaseException | StageEngine] = []

    def work(progress: Progress) -> StageEngine:
        def held(done: int, total: int) -> None:
            calls.append(done)
            if len(calls) == 2:  # inside llama.cpp's load: hold it here until the await is cancelled
                inside.set()
                go_on.wait(60)
            progress(done, total)

        try:
            engine = StageEngine(path, CONFIG, final=False, progress=held)
        except BaseException as exc:
            outcome.append(exc)
            raise
        finally:
            ended.set()
        outcome.append(engine)
        return engine

    await cancel_inside(work, inside, go_on, ended)
    assert len(outcome) == 1 and isinstance(outcome[0], WorkStopped), outcome
    assert len(calls) == 2, f"llama.cpp's load went on for {len(calls) - 2} more tensors after the stop"

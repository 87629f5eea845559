"""The engine probe in a process of its own, so that a llama.cpp crash while probing does not kill the member.

Some llama.cpp builds crash on mixture-of-experts graphs that others run (llama.cpp's issue #20824: a
segfault in the AMX kernels, on MoE models only, with GGML_NATIVE on a CPU that has AMX). The probe
times one MoE block per expert type; a member whose build cannot run them must still join a dense
session. So the probe runs in a spawned child: when that dies (or hangs), it runs again without
the MoE blocks (the planner then charges routed experts the dense prefill rate) and says so.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kafila.engine.probe import ProbeResult, probe
from kafila.errors import EngineError
from kafila.model.stage_cache import StageCache

log = logging.getLogger("kafila.probe")
STALL_S = 300.0  # a child silent this long (its steps come every call) is hung, not slow: killed, as if crashed
POLL_S = 0.5  # how soon a stop (the member's session ended meanwhile) kills the child
Measure = Callable[..., ProbeResult]  # kafila.engine.probe.probe's signature


def _child(conn: Connection, measure: Measure, model: str, cache_root: str, kwargs: dict[str, Any]) -> None:
    def step(text: str, done: int, total: int) -> None:
        conn.send(("step", text, done, total))

    try:
        result = measure(Path(model), StageCache(Path(cache_root)), on_step=step, **kwargs)
        conn.send(("result", result.as_dict()))
    except BaseException as exc:  # sent back, raised in the parent with its text
        conn.send(("error", exc))


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _run(measure: Measure, model: Path, cache: StageCache, on_step: Callable[[str, int, int], None] | None,
         kwargs: dict[str, Any], stall_s: float, stop: threading.Event | None) -> ProbeResult | str:
    """The child's result, or how it ended when it sent none (a crash, a hang); EngineError once `stop` is set."""
    ctx = mp.get_context("spawn")  # a fork would copy the caller's threads' locks (asyncio, the QUIC endpoint)
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(theirs, measure, str(model), str(cache.root), kwargs), daemon=True)
    proc.start()
    theirs.close()  # the child's end: EOF here once the child is gone, however it ended
    try:
        while True:
            silent = 0.0
            while not ours.poll(min(POLL_S, stall_s)):  # in slices: a stop must not wait for the next step
                silent += min(POLL_S, stall_s)
                if stop is not None and stop.is_set():
                    proc.kill()
                    raise EngineError("the probe was stopped")
                if silent >= stall_s:
                    proc.kill()
                    return f"no progress for {stall_s:.0f} s"
            try:
                kind, *payload = ours.recv()
            except EOFError:
                proc.join()
                return _exit_text(proc.exitcode)
            if kind == "step":
                if on_step:
                    on_step(*payload)
            elif kind == "error":
                raise payload[0]
            else:
                return ProbeResult.from_dict(payload[0])
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        ours.close()


def probe_isolated(model: Path, cache: StageCache, on_step: Callable[[str, int, int], None] | None = None,
                   measure: Measure = probe, stall_s: float = STALL_S, stop: threading.Event | None = None,
                   **kwargs: Any) -> ProbeResult:
    """`measure(model, cache, on_step=…, **kwargs)` (the probe) in a spawned process; again without its
    mixture-of-experts blocks when the first run crashed or hung. Setting `stop` kills it (EngineError)."""
    got = _run(measure, model, cache, on_step, kwargs, stall_s, stop)
    if isinstance(got, ProbeResult):
        return got
    log.warning("the probe failed (%s); probing again without mixture-of-experts blocks, whose routed "
                "experts are then planned at the dense prefill rate", got)
    again = _run(measure, model, cache, on_step, {**kwargs, "expert_shapes": ()}, stall_s, stop)
    if isinstance(again, ProbeResult):
        return again
    raise EngineError(f"the probe failed twice ({got}; then without mixture-of-experts blocks, {again}): "
                      "this llama.cpp build cannot run Kafila's stages on this machine")

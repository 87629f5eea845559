"""One local llama.cpp context on the whole file: the baseline `kafila bench scale` holds the ring against.

The long prompt goes through llama-cpp-python's own greedy chat completion (its reply is what the ring's
must equal, and its time to first token the ring's TTFT is held against); decode is timed on a context of
Kafila's engine from position 0.

Runs in a process of its own (spawned), so its memory is its own and the benchmark's process
keeps the host's peak RSS for itself. Same settings as a stage (ContextConfig), all cores.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kafila.errors import EngineError


def _chat(model: str, prompt: str, n_ctx: int, n_batch: int, reply_tokens: int) -> dict[str, Any]:
    """llama-cpp-python's own greedy chat completion of `prompt` as one user message: its reply (the ground
    truth the ring's must equal) and its time to first token (prefilled in n_batch rows, as the ring's chunks).
    """
    import os

    from llama_cpp import Llama, LogitsProcessorList

    from kafila.engine.llama_lib import llama

    llama()  # the library Kafila's own engine uses
    threads = os.cpu_count() or 1
    llm = Llama(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    seen: list[tuple[float, int]] = []  # (time, tokens so far) at every sampling: the first is the end of prefill

    def watch(ids: Any, scores: Any) -> Any:  # sees the logits, changes nothing
        seen.append((time.perf_counter(), len(ids)))
        return scores

    try:
        t0 = time.perf_counter()
        out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=reply_tokens,
                                         temperature=0, logits_processor=LogitsProcessorList([watch]))
    finally:
        llm.close()
    if not seen:
        raise EngineError("llama-cpp-python's chat completion sampled no token")
    return {"prompt_tokens": seen[0][1], "ttft_s": seen[0][0] - t0,
            "reply": str(out["choices"][0]["message"]["content"]),  # type: ignore[index]
            "reply_tokens": len(seen)}


def _decode(model: str, n_ctx: int, n_batch: int, tokens: int) -> float:
    """Median seconds per greedy decode step of one context from position 0 (as the ring's and the pipes'
    decode figures are taken: after a short prompt)."""
    import numpy as np

    from kafila.engine.reference import ReferenceContext
    from kafila.engine.stage import ContextConfig, Rows

    ref = ReferenceContext(Path(model), ContextConfig(n_ctx_per_seq=n_ctx, n_seq_max=1, n_batch=n_batch))
    try:
        times, token = [], 1
        for pos in range(tokens):
            rows = Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool))
            t1 = time.perf_counter()
            token = int(np.argmax(ref.run(np.array([token], np.int32), rows)[0]))
            times.append(time.perf_counter() - t1)
    finally:
        ref.close()
    return statistics.median(times)


def _measure(model: str, prompt: str, n_ctx: int, n_batch: int, tokens: int, reply_tokens: int) -> dict[str, Any]:
    result = _chat(model, prompt, n_ctx, n_batch, reply_tokens)
    result["decode_ms_per_token"] = _decode(model, n_ctx, n_batch, tokens) * 1e3
    result["n_batch"] = n_batch
    return result


def _child(conn: Connection, *args: Any) -> None:
    import os

    from kafila.bench.proc_mem import status_kb

    try:
        result = _measure(*args)
        result["peak_rss_mb"] = (status_kb(os.getpid(), "VmHWM") or 0) / 1024
        conn.send(result)
    except BaseException as exc:  # sent back, raised in the parent with its text
        conn.send(exc)


def local_context(model: Path, prompt: str, n_ctx: int, n_batch: int, tokens: int,
                  reply_tokens: int) -> dict[str, Any]:
    """llama-cpp-python's greedy chat reply to `prompt` (`reply_tokens` long) and its TTFT (prefilled in n_batch
    rows), and the median decode ms/token of one context."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(theirs, str(model), prompt, n_ctx, n_batch, tokens, reply_tokens),
                       daemon=True)
    proc.start()
    try:
        while not ours.poll(1.0):
            if not proc.is_alive():
                raise EngineError(f"the local llama.cpp context's process ended (exit {proc.exitcode})")
        result = ours.recv()
    finally:
        proc.join(30)
    if isinstance(result, BaseException):
        raise result
    return dict(result)

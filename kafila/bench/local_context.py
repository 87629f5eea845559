"""One local llama.cpp context on the whole file: the baseline `kafila bench scale` holds the ring against.

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


def _measure(model: str, prompt: str, n_ctx: int, n_batch: int, tokens: int) -> dict[str, Any]:
    import numpy as np

    from kafila.engine.llama_lib import llama
    from kafila.engine.reference import ReferenceContext
    from kafila.engine.stage import ContextConfig, Rows
    from kafila.engine.vocab import Vocab

    ref = ReferenceContext(Path(model), ContextConfig(n_ctx_per_seq=n_ctx, n_seq_max=1, n_batch=n_batch))
    try:
        # the prompt as a completion request's text is tokenised (kafila.session.head)
        vocab = Vocab(llama().llama_model_get_vocab(ref._model), None)
        ids = np.array(vocab.tokenize(prompt, add_special=True, parse_special=True), np.int32)
        t0 = time.perf_counter()
        for start in range(0, len(ids), n_batch):  # prefill in n_batch rows, as llama.cpp does
            part = ids[start:start + n_batch]
            want = np.zeros(len(part), bool)
            want[-1] = start + len(part) == len(ids)
            logits = ref.run(part, Rows(np.zeros(len(part), np.int32),
                                        np.arange(start, start + len(part), dtype=np.int32), want))
        token = int(np.argmax(logits[-1]))
        ttft_s = time.perf_counter() - t0
        ref.free(0)
        times = []
        for pos in range(tokens):
            rows = Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool))
            t1 = time.perf_counter()
            token = int(np.argmax(ref.run(np.array([token], np.int32), rows)[0]))
            times.append(time.perf_counter() - t1)
    finally:
        ref.close()
    return {"prompt_tokens": len(ids), "ttft_s": ttft_s, "decode_ms_per_token": statistics.median(times) * 1e3,
            "n_batch": n_batch}


def _child(conn: Connection, *args: Any) -> None:
    import os

    from kafila.bench.proc_mem import status_kb

    try:
        result = _measure(*args)
        result["peak_rss_mb"] = (status_kb(os.getpid(), "VmHWM") or 0) / 1024
        conn.send(result)
    except BaseException as exc:  # sent back, raised in the parent with its text
        conn.send(exc)


def local_context(model: Path, prompt: str, n_ctx: int, n_batch: int, tokens: int) -> dict[str, Any]:
    """TTFT of `prompt` (prefilled in n_batch rows) and the median decode ms/token of one context."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(theirs, str(model), prompt, n_ctx, n_batch, tokens), daemon=True)
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

"""What this machine allows a ring without any network stack: the same stages, one process each, joined by OS pipes.

`kafila bench ring` (a) reports it beside the real ring, so the ring's overhead over one local
context splits into what sharing the machine between stage processes costs (here) and what the
transport adds (the rest). Greedy decode; this process embeds and samples, as the head would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np


def _stage(path: str, final: bool, threads: int, env: dict[str, str], inbox: Connection, outbox: Connection,
           report: Connection) -> None:
    os.environ.update(env)  # before llama.cpp (and its OpenMP runtime) is loaded in this process
    from kafila.engine.stage import ContextConfig, Rows, StageEngine

    engine = StageEngine(path, ContextConfig(n_ctx_per_seq=1024, n_seq_max=4, n_batch=128, n_threads=threads),
                         final)
    times: list[float] = []
    while (msg := inbox.recv_bytes()) != b"":
        pos = int.from_bytes(msg[:4], "little")
        rows = Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool))
        t0 = time.perf_counter()
        out = engine.run(np.frombuffer(msg[4:], np.float32).reshape(1, -1).copy(), rows)
        times.append(time.perf_counter() - t0)
        outbox.send_bytes(msg[:4] + (int(np.argmax(out[0])).to_bytes(4, "little") if final else out.tobytes()))
    engine.close()
    report.send(statistics.median(times) if times else 0.0)


def pipe_ring(model: Path, stage_paths: list[Path], threads: int, env: dict[str, str],
              tokens: int) -> dict[str, object]:
    """Median ms per decode token through `stage_paths` (the head's stage last), and each stage's median ms."""
    from kafila.engine.embedding import Embedder

    ctx = mp.get_context("spawn")
    n = len(stage_paths)
    pipes = [ctx.Pipe(duplex=False) for _ in range(n + 1)]  # pipes[i]: into stage i; pipes[n]: back to us
    reports = [ctx.Pipe(duplex=False) for _ in range(n)]
    procs = [ctx.Process(target=_stage, daemon=True,
                         args=(str(p), i == n - 1, threads, env, pipes[i][0], pipes[i + 1][1], reports[i][1]))
             for i, p in enumerate(stage_paths)]
    for p in procs:
        p.start()
    try:
        embed = Embedder(model)
        token, gaps = 1, []
        for pos in range(tokens + 3):  # the first calls load pages: not timed
            t0 = time.perf_counter()
            pipes[0][1].send_bytes(pos.to_bytes(4, "little") + embed.rows([token]).tobytes())
            token = int.from_bytes(pipes[n][0].recv_bytes()[4:], "little")
            if pos >= 3:
                gaps.append(time.perf_counter() - t0)
        for i in range(n):
            pipes[i][1].send_bytes(b"")
        stage_ms = [r[0].recv() * 1e3 for r in reports]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return {"ms_per_token": statistics.median(gaps) * 1e3, "stage_ms": stage_ms}

"""One local llama.cpp context on the whole file: the baseline `kafila bench scale` holds the ring against.

The long prompt goes through llama-cpp-python's greedy chat completion (its reply is what the ring's
must equal, and its time to first token the ring's TTFT is held against); decode is timed on a context of
Kafila's engine from position 0, alternating with the ring's decode (LocalDecoder).

Runs in a process of its own (spawned), so its memory is its own and the benchmark's process
keeps the host's peak RSS for itself. Same settings as a stage (ContextConfig), all cores.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafila.errors import EngineError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from kafila.engine.stage import ContextConfig


def greedy_chat(model: str, prompt: str, n_ctx: int, n_batch: int, reply_tokens: int) -> dict[str, Any]:
    """llama-cpp-python's greedy chat reply to `prompt` as one user message (the ground truth the ring's must
    equal) and its time to first token (prefilled in n_batch rows, as the ring's chunks).

    The prompt is what llama-cpp-python's `create_chat_completion` builds (the model's own template through
    its Jinja2 formatter, tokenized as it does), prefilled and decoded greedily on its context; the steps are
    counted here in tokens because its completion loop checks `max_tokens` only after a token ends a UTF-8
    character: on a random-weight model that keeps choosing byte fragments it decodes until the context is
    full and fails (`llama_decode returned 1`). The reply's bytes are decoded as the ring's head does
    (kafila.engine.vocab: incomplete or invalid UTF-8 dropped).
    """
    import os

    import numpy as np
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from kafila.engine.llama_lib import llama

    lib = llama()  # the library Kafila's own engine uses
    threads = os.cpu_count() or 1
    llm = Llama(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    try:
        text = llm._model.token_get_text  # as llama-cpp-python builds its own chat handler
        eos, bos = llm.token_eos(), llm.token_bos()
        formatted = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], text(eos) if eos != -1 else "",
                                        text(bos) if bos != -1 else "")(messages=[{"role": "user", "content": prompt}])
        ids = llm.tokenize(formatted.prompt.encode("utf-8"), add_bos=not formatted.added_special, special=True)
        t0 = time.perf_counter()
        llm.eval(ids)
        ttft, reply = 0.0, []
        for _ in range(reply_tokens):  # the last row's logits (llama-cpp-python keeps none itself)
            token = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))))
            ttft = ttft or time.perf_counter() - t0
            if lib.llama_vocab_is_eog(lib.llama_model_get_vocab(llm.model), token):
                break
            reply.append(token)
            llm.eval([token])
        text_bytes = llm.detokenize(reply)
    finally:
        llm.close()
    return {"prompt_tokens": len(ids), "ttft_s": ttft, "reply_tokens": len(reply),
            "reply": text_bytes.decode("utf-8", errors="ignore")}


def decode_steps(ref: Any, tokens: int) -> list[float]:
    """Seconds of each greedy decode step of a ReferenceContext, from position 0 of sequence 0 for `tokens` steps
    (as the ring's and the pipes' decode figures are taken: after a short prompt); the sequence is dropped after."""
    import numpy as np

    from kafila.engine.stage import Rows

    times, token = [], 1
    for pos in range(tokens):
        rows = Rows(np.zeros(1, np.int32), np.array([pos], np.int32), np.ones(1, bool))
        t0 = time.perf_counter()
        token = int(np.argmax(ref.run(np.array([token], np.int32), rows)[0]))
        times.append(time.perf_counter() - t0)
    ref.free(0)
    return times


def decode_step_s(model: Path, config: ContextConfig, tokens: int) -> float:
    """Median seconds per greedy decode step of one llama.cpp context on the whole file (decode_steps)."""
    from kafila.engine.reference import ReferenceContext

    ref = ReferenceContext(model, config)
    try:
        return statistics.median(decode_steps(ref, tokens))
    finally:
        ref.close()


def _decoder(conn: Connection, model: str, config: ContextConfig) -> None:
    from kafila.engine.reference import ReferenceContext

    try:
        ref = ReferenceContext(Path(model), config)
    except BaseException as exc:  # sent back, raised in the parent with its text
        conn.send(exc)
        return
    conn.send(None)
    try:
        while tokens := conn.recv():
            conn.send(statistics.median(decode_steps(ref, tokens)))
    finally:
        ref.close()


def _receive(conn: Connection, proc: BaseProcess) -> Any:
    """The local context's process's next answer; the exception it sent back raised here, EngineError if it ended."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise EngineError(f"the local llama.cpp context's process ended (exit {proc.exitcode})")
    out = conn.recv()
    if isinstance(out, BaseException):
        raise out
    return out


class LocalDecoder:
    """One local llama.cpp context on the whole file, in a process of its own, timing greedy decode when asked.

    `bench scale` asks it between the ring's decode replies, so that both figures come from the same minutes:
    this shared machine's speed moves by up to a third between runs minutes apart, as much as the ratio's
    margin. It holds the model only while the ring's decode is measured (its RSS is not the ring's)."""

    def __init__(self, model: Path, config: ContextConfig) -> None:
        ctx = mp.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_decoder, args=(theirs, str(model), config), daemon=True)
        self._proc.start()
        self._answer()  # loaded, or why not

    def _answer(self) -> Any:
        return _receive(self._conn, self._proc)

    def ms_per_token(self, tokens: int) -> float:
        """Median ms per greedy decode step over `tokens` steps from position 0."""
        self._conn.send(tokens)
        return float(self._answer()) * 1e3

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(0)
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()

    def __enter__(self) -> LocalDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _measure(model: str, prompt: str, n_ctx: int, n_batch: int, reply_tokens: int) -> dict[str, Any]:
    result = greedy_chat(model, prompt, n_ctx, n_batch, reply_tokens)
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


def local_context(model: Path, prompt: str, n_ctx: int, n_batch: int, reply_tokens: int) -> dict[str, Any]:
    """llama-cpp-python's greedy chat reply to `prompt` (`reply_tokens` long) and its TTFT (prefilled in n_batch
    rows); decode is LocalDecoder's."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(theirs, str(model), prompt, n_ctx, n_batch, reply_tokens),
                       daemon=True)
    proc.start()
    try:
        return dict(_receive(ours, proc))
    finally:
        proc.join(30)

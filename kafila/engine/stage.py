"""One llama.cpp context over a stage file: hidden states in, hidden states (body) or logits (head) out.

Input rows go in through `llama_batch.embd`. A body stage's output is read from its last layer's
residual (`l_out-{n_layer-1}`) by the context's eval callback (in C, see capture.py); every row
is marked as an output, because llama.cpp computes the last layer only for output rows.
Splitting a model into such stages adds no numerical difference of its own (tests compare
against one context on the whole file with `np.array_equal`).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kafila.engine.capture import TensorCapture
from kafila.engine.devices import plan_offload
from kafila.engine.llama_lib import llama
from kafila.engine.ubatch import in_batch_order, ubatches
from kafila.errors import EngineError
from kafila.model.arch import RESTORE_INPUT_KEY
from kafila.model.gguf_file import GGUFFile

log = logging.getLogger("kafila.engine")
_ONE_ROW = np.ones(1, bool)  # a body stage's one row, an output row (read only)
# (bytes done, total bytes), called between tensors while llama.cpp loads a file; it may raise to stop the
# load (kafila.session.stoppable hands one that raises WorkStopped once the session is ending)
LoadProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class ContextConfig:
    """llama.cpp context settings; every stage of a ring and any reference must use the same ones."""

    n_ctx_per_seq: int = 2048
    n_seq_max: int = 4
    n_batch: int = 512  # most rows one call may carry; prefill is chunked to this
    n_threads: int = 0  # 0: all cores
    gpu: bool = True  # offload the whole stage to a GPU when llama.cpp has one and it fits (devices.py)

    @property
    def threads(self) -> int:
        return self.n_threads or os.cpu_count() or 1


@dataclass(frozen=True)
class Rows:
    """A batch of rows for one stage call: row i belongs to sequence seq[i] at position pos[i]."""

    seq: np.ndarray  # int32 (n,)
    pos: np.ndarray  # int32 (n,)
    want: np.ndarray  # bool (n,): rows whose logits the head must return (body stages: ignored)
    step: np.ndarray | None = None  # int (n,): a drafted row's place in its verification (ubatch.py); None: all 0

    def __len__(self) -> int:
        return len(self.seq)


def make_context_params(config: ContextConfig) -> Any:
    """Context params shared by stages and by the single-context reference."""
    lc = llama()
    params = lc.llama_context_default_params()
    params.n_ctx = config.n_ctx_per_seq * config.n_seq_max
    params.n_batch = config.n_batch
    params.n_ubatch = config.n_batch  # one ubatch per call keeps rows in batch order
    params.n_seq_max = config.n_seq_max
    params.n_threads = config.threads
    params.n_threads_batch = config.threads
    # One KV stream per sequence: a request's numbers do not depend on its slot or on what the others hold
    # (DESIGN §2d). llama.cpp then computes only "equal" ubatches; run() makes its calls such (ubatch.py).
    params.kv_unified = False
    params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.no_perf = True
    return params


def fork_sequence(mem: Any, src: int, dst: int, keep: int) -> None:
    """`dst` becomes `src`'s positions [0, keep). Each sequence has a KV stream of its own (kv_unified off), and
    llama.cpp copies between streams only whole (the buffer copy waits for the next decode), so the copy is of
    the whole sequence, then the positions from `keep` on are dropped again."""
    lc = llama()
    lc.llama_memory_seq_rm(mem, dst, -1, -1)
    if keep > 0:
        lc.llama_memory_seq_cp(mem, src, dst, -1, -1)
        if not lc.llama_memory_seq_rm(mem, dst, keep, -1):
            raise EngineError(f"llama.cpp could not drop sequence {dst} from position {keep}")


def logits_out(ctx: Any, n_out: int, n_vocab: int) -> np.ndarray:
    """A copy of the logits of the last call's `n_out` output rows."""
    if n_out == 0:
        return np.empty((0, n_vocab), np.float32)
    return np.ctypeslib.as_array(llama().llama_get_logits(ctx), shape=(n_out, n_vocab)).copy()


def load_model(path: Path, n_gpu_layers: int = 0, progress: LoadProgress | None = None) -> Any:
    """Load a GGUF into llama.cpp (mmap; `n_gpu_layers` on the GPU); a refusal becomes an EngineError.

    `progress` is called between tensors; an exception it raises aborts the load (llama.cpp stops at
    its progress callback's `false`) and is raised here once llama.cpp has cleaned up. Loading a big
    stage takes seconds (Q4_0 is repacked for the CPU, a GPU stage is copied), too long to make a
    stopping member wait for it.
    """
    lc = llama()
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    raised: list[BaseException] = []
    if progress is not None:
        total = Path(path).stat().st_size

        @lc.llama_progress_callback
        def on_progress(fraction: float, _user: object) -> bool:
            # An exception must not cross into C: keep it, and tell llama.cpp to stop.
            try:
                progress(int(fraction * total), total)
            except BaseException as exc:
                raised.append(exc)
                return False
            return True

        mparams.progress_callback = on_progress  # lives on this frame for the whole (synchronous) load
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    if raised:
        if model:
            lc.llama_model_free(model)
        raise raised[0]
    if not model:
        # most often a model architecture this llama.cpp build does not know
        raise EngineError(f"llama.cpp {lc.__version__} could not load {Path(path).name} "
                          f"(an architecture this build does not know? see -vv for its log)")
    return model


class StageEngine:
    """A loaded stage. `final=True` for the head's range (logits out), else hidden states out.

    `progress` (see load_model) can stop the load; it is called once more before the context is made.
    """

    def __init__(self, path: str | Path, config: ContextConfig, final: bool,
                 progress: LoadProgress | None = None) -> None:
        lc = llama()
        self.path = Path(path)
        self.config = config
        self.final = final
        self.offload = plan_offload(self.path, config.n_ctx_per_seq * config.n_seq_max, config.gpu)
        log.debug("stage %s: %s", self.path.name, self.offload.reason)
        self._model = load_model(self.path, self.offload.n_gpu_layers, progress)
        if progress is not None:
            size = self.path.stat().st_size
            try:
                progress(size, size)
            except BaseException:
                lc.llama_model_free(self._model)
                raise
        self.n_embd = int(lc.llama_model_n_embd(self._model))
        self.n_layer = int(lc.llama_model_n_layer(self._model))
        self.vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        params = make_context_params(config)
        self._capture: TensorCapture | None = None
        # Gemma 1/2 stages after the first restore their input over the graph's own input scaling.
        self._restore = str(GGUFFile(self.path).get(RESTORE_INPUT_KEY, ""))
        if not final or self._restore:
            # Kept on self: llama.cpp holds raw pointers to it for the context's lifetime.
            target = "" if final else f"l_out-{self.n_layer - 1}"
            self._capture = TensorCapture(target, config.n_batch, self.n_embd, self._restore)
            self._capture.install(params, lc.ggml_backend_sched_eval_callback)
        self._ctx = lc.llama_init_from_model(self._model, params)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise EngineError(f"llama.cpp could not create a context for {self.path.name}")
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(config.n_batch, self.n_embd, 1)

    def run(self, embd: np.ndarray, rows: Rows) -> np.ndarray:
        """Run the stage on `embd` (n, n_embd); hidden states (n, n_embd), or logits (wanted rows, n_vocab)."""
        n = len(rows)
        if embd.shape != (n, self.n_embd) or embd.dtype != np.float32:
            raise EngineError(f"stage expects float32 rows of width {self.n_embd}, got {embd.dtype} {embd.shape}")
        if not 0 < n <= self.config.n_batch:
            raise EngineError(f"a stage call carries 1..{self.config.n_batch} rows, got {n}")
        self._check_seqs(rows.seq)
        if n == 1:  # a decode step: one call and nothing to put back in order (kept short: each one waits on it)
            return self._call(embd, rows if self.final else Rows(rows.seq, rows.pos, _ONE_ROW))
        want = rows.want if self.final else np.ones(n, bool)
        calls = ubatches(rows.seq, rows.step)
        parts = [self._call(embd[i], Rows(rows.seq[i], rows.pos[i], want[i])) for i in calls]
        return in_batch_order(calls, want, parts)

    def _call(self, embd: np.ndarray, rows: Rows) -> np.ndarray:
        """One llama_decode over rows llama.cpp keeps as one ubatch (ubatch.py)."""
        lc = llama()
        n = len(rows)
        b = self._batch
        b.n_tokens = n
        ctypes.memmove(b.embd, np.ascontiguousarray(embd).ctypes.data, embd.nbytes)
        for i in range(n):
            b.pos[i] = int(rows.pos[i])
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = int(rows.seq[i])
            b.logits[i] = int(rows.want[i])
        if self._capture is not None:
            self._capture.reset()
            if self._restore:
                self._capture.set_input(embd)
        rc = lc.llama_decode(self._ctx, b)
        if self._capture is not None and rc != 0 and not self.final:
            self._capture.rows(n)  # raises with what the callback saw, if that is why the call failed
        if self._capture is not None:
            self._capture.check_restored()
        if rc != 0:
            raise EngineError(f"llama_decode failed with status {rc} on {self.path.name} ({n} rows)")
        if self.final:
            return logits_out(self._ctx, int(rows.want.sum()), self.n_vocab)
        assert self._capture is not None
        return self._capture.rows(n)

    def _check_seqs(self, seqs: np.ndarray) -> None:
        # llama.cpp aborts the process (GGML_ASSERT) on a sequence id past its slots in some calls
        if len(seqs) and not (0 <= int(seqs.min()) and int(seqs.max()) < self.config.n_seq_max):
            raise EngineError(f"sequence ids must be 0..{self.config.n_seq_max - 1} (the admitted slots), "
                              f"got {int(seqs.min())}..{int(seqs.max())}")

    def free(self, seq_id: int, keep: int = 0) -> None:
        """Drop a sequence's KV cache from position `keep` on (0: all of it)."""
        self._check_seqs(np.array([seq_id]))
        if not llama().llama_memory_seq_rm(self._mem, seq_id, keep if keep > 0 else -1, -1):
            raise EngineError(f"llama.cpp could not drop sequence {seq_id} from position {keep}")

    def fork(self, src: int, seq_id: int, keep: int) -> None:
        """Make sequence `seq_id` hold a copy of sequence `src`'s positions before `keep` (nothing else)."""
        self._check_seqs(np.array([src, seq_id]))
        fork_sequence(self._mem, src, seq_id, keep)

    def sequence_state(self, seq_id: int) -> bytes:
        """Sequence `seq_id`'s KV cache as llama.cpp saves it (its cells' positions, then K and V of every layer
        here): two stages hold the same cache for a request exactly when these bytes are equal."""
        lc = llama()
        self._check_seqs(np.array([seq_id]))
        size = int(lc.llama_state_seq_get_size(self._ctx, seq_id))
        out = (ctypes.c_uint8 * size)()
        if int(lc.llama_state_seq_get_data(self._ctx, out, size, seq_id)) != size:
            raise EngineError(f"llama.cpp could not save sequence {seq_id}'s KV cache")
        return bytes(out)

    def close(self) -> None:
        """Free the context and the model; safe to call twice."""
        lc = llama()
        if getattr(self, "_ctx", None):
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            lc.llama_model_free(self._model)
            self._ctx = None

    def __enter__(self) -> StageEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""One llama.cpp context on the whole model file, fed token ids: the ground truth tests and benchmarks compare with,
and a draft model's context (draft.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kafila.engine.llama_lib import llama
from kafila.engine.stage import ContextConfig, Rows, fork_sequence, load_model, logits_out, make_context_params
from kafila.engine.ubatch import in_batch_order, ubatches
from kafila.errors import EngineError


class ReferenceContext:
    """The whole model in one context, token ids in, logits out, with the same settings as the stages."""

    def __init__(self, path: Path, config: ContextConfig) -> None:
        lc = llama()
        self._model = load_model(path)
        self._ctx = lc.llama_init_from_model(self._model, make_context_params(config))
        self._mem = lc.llama_get_memory(self._ctx)
        self.vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self._batch = lc.llama_batch_init(config.n_batch, 0, 1)

    def run(self, tokens: np.ndarray, rows: Rows) -> np.ndarray:
        """Logits of the wanted rows, the batch cut into calls as the stages cut theirs (ubatch.py)."""
        calls = ubatches(rows.seq, rows.step)
        parts = [self._call(tokens[i], Rows(rows.seq[i], rows.pos[i], rows.want[i])) for i in calls]
        return in_batch_order(calls, rows.want, parts)

    def _call(self, tokens: np.ndarray, rows: Rows) -> np.ndarray:
        lc = llama()
        b = self._batch
        b.n_tokens = len(rows)
        for i in range(len(rows)):
            b.token[i] = int(tokens[i])
            b.pos[i] = int(rows.pos[i])
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = int(rows.seq[i])
            b.logits[i] = int(rows.want[i])
        if lc.llama_decode(self._ctx, b) != 0:
            raise EngineError(f"llama_decode failed on {len(rows)} rows")
        return logits_out(self._ctx, int(rows.want.sum()), self.n_vocab)

    def free(self, seq_id: int, keep: int = 0) -> None:
        """Drop a sequence's KV cache from position `keep` on (0: all of it), as a stage does."""
        if not llama().llama_memory_seq_rm(self._mem, seq_id, keep if keep > 0 else -1, -1):
            raise EngineError(f"llama.cpp could not drop sequence {seq_id} from position {keep}")

    def fork(self, src: int, seq_id: int, keep: int) -> None:
        """Sequence `seq_id` becomes a copy of `src`'s positions before `keep`, as a stage does."""
        fork_sequence(self._mem, src, seq_id, keep)

    def close(self) -> None:
        lc = llama()
        lc.llama_batch_free(self._batch)
        lc.llama_free(self._ctx)
        lc.llama_model_free(self._model)

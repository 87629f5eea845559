"""llama.cpp's own samplers on a row of logits: the ground truth of Kafila's logit bias, penalties and min-p.

Two penalty samplers, as Kafila's fields are defined (kafila/engine/penalties.py): `repeat_penalty` over
the last `repeat_last_n` tokens of prompt and reply (llama.cpp's server feeds its sampler the prompt), and
`presence_penalty`/`frequency_penalty` over the reply (OpenAI's), each one of llama.cpp's penalty samplers
fed only those tokens.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from kafila.engine.llama_lib import llama

WHOLE = 1 << 20  # a window longer than any reply


def apply(sampler: Any, logits: np.ndarray) -> np.ndarray:
    """The logits after one llama.cpp sampler; -inf where it dropped a token."""
    lib, n = llama(), len(logits)
    # llama_token_data is {int32 id; float logit; float p}: a numpy record array of the same layout, shared
    rows = np.zeros(n, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    rows["id"], rows["logit"] = np.arange(n), logits
    cur = lib.llama_token_data_array(rows.ctypes.data_as(lib.llama_token_data_p), n, -1, False)
    lib.llama_sampler_apply(sampler, ctypes.byref(cur))
    # a sampler may sort the rows or point `data` at fewer of them: read back through its pointer
    kept = np.ctypeslib.as_array(ctypes.cast(cur.data, ctypes.POINTER(ctypes.c_uint8)), (cur.size * 12,))
    kept = kept.view(rows.dtype)
    out = np.full(n, -np.inf)
    out[kept["id"]] = kept["logit"]
    return out


def penalties(last_n: int, repeat: float, frequency: float, presence: float) -> Any:
    """llama.cpp's penalty sampler. Its C signature lost its first argument (n_vocab) after the Python binding
    was written: passing the window twice is right either way (the floats go in their own registers)."""
    return llama().llama_sampler_init_penalties(last_n, last_n, repeat, frequency, presence)


class LlamaSamplers:
    """llama.cpp's logit-bias sampler, then its penalties, for one request; `prime` with the prompt."""

    def __init__(self, n_vocab: int, bias: Sequence[tuple[int, float]] = (), repeat: float = 1.0,
                 last_n: int = 64, frequency: float = 0.0, presence: float = 0.0) -> None:
        lib = llama()
        entries = (lib.llama_logit_bias * max(len(bias), 1))(*[lib.llama_logit_bias(t, b) for t, b in bias])
        self.samplers = [lib.llama_sampler_init_logit_bias(n_vocab, len(bias), entries),
                         penalties(last_n, repeat, 0.0, 0.0), penalties(WHOLE, 1.0, frequency, presence)]

    def prime(self, prompt: Sequence[int]) -> None:
        for t in prompt:
            llama().llama_sampler_accept(self.samplers[1], t)

    def accept(self, token: int) -> None:
        for s in self.samplers[1:]:
            llama().llama_sampler_accept(s, token)

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        for s in self.samplers:
            logits = apply(s, logits)
        return logits

    def close(self) -> None:
        for s in self.samplers:
            llama().llama_sampler_free(s)


def last_logits(model: Any) -> np.ndarray:
    """The logits of the last row `model` (llama-cpp-python's `Llama`) computed, as llama.cpp returned them."""
    row = llama().llama_get_logits_ith(model._ctx.ctx, -1)
    return np.ctypeslib.as_array(row, shape=(model.n_vocab(),)).copy()


def greedy_reply(model: Any, prompt: Sequence[int], samplers: LlamaSamplers, max_tokens: int) -> list[int]:
    """llama-cpp-python's `Llama` decoding `prompt` greedily, each row's logits through `samplers`."""
    model.reset()
    model.eval(list(prompt))
    samplers.prime(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(np.argmax(samplers.adjust(last_logits(model))))
        if llama().llama_vocab_is_eog(model._model.vocab, token):
            break
        out.append(token)
        samplers.accept(token)
        model.eval([token])
    return out

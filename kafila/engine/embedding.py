"""Embedding rows for token ids, dequantised from the model's own `token_embd` tensor.

The head turns tokens into rows itself (the first stage of the chain never sees token ids);
`gguf.quants.dequantize` computes exactly what llama.cpp's get_rows on that tensor computes.
Gemma 3 scales embeddings by sqrt(n_embd) in its graph only for token input, so for it the head
applies that scale to the rows itself, in float32 as ggml does (its architecture profile says so).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, quants

from kafila.errors import EngineError, ModelError
from kafila.model.arch import SUPPORTED
from kafila.model.gguf_file import GGUFFile


class Embedder:
    """Looks up embedding rows of one GGUF's `token_embd.weight` (memory-mapped, dequantised per call)."""

    def __init__(self, path: str | Path) -> None:
        gf = GGUFFile(path)
        tensor = gf.tensors.get("token_embd.weight")
        if tensor is None:
            raise ModelError(f"{Path(path).name} has no token_embd.weight")
        self._data = gf.tensor_bytes(tensor)  # (n_vocab, bytes per row)
        self._type = tensor.type
        # gguf's per-type row dequantiser, without dequantize()'s grouping of many rows (a decode step looks
        # up one row, on the head's path between two stage calls: Q4_0's 19 -> 14 us here, and ~100 us
        # with the caches cold after the head's stage call)
        kind = quants._type_traits.get(self._type)  # gguf keeps this per-type table private
        if kind is not None:
            kind.init_grid()
        self._dequantize_rows = kind.dequantize_rows if kind is not None else None
        self.n_embd, self.n_vocab = tensor.ne[0], tensor.ne[1]
        profile = SUPPORTED.get(str(gf.get("general.architecture", "")))
        # ggml computes sqrtf((float) n_embd) and multiplies in float32: the same here, bit for bit.
        self._scale = np.float32(np.sqrt(np.float32(self.n_embd))) if profile and profile.embed_scale_sqrt else None

    def rows(self, tokens: np.ndarray | list[int]) -> np.ndarray:
        """float32 (len(tokens), n_embd) embedding rows."""
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise EngineError(f"token id out of range 0..{self.n_vocab - 1}: {ids.min()}..{ids.max()}")
        raw = self._data[ids]
        if self._type == GGMLQuantizationType.F32:
            out = np.ascontiguousarray(raw).view(np.float32)
        elif self._dequantize_rows is not None:
            out = self._dequantize_rows(raw)
        else:
            out = quants.dequantize(raw, self._type).astype(np.float32, copy=False)
        out = np.ascontiguousarray(out.reshape(len(ids), self.n_embd), dtype=np.float32)
        return out if self._scale is None else out * self._scale

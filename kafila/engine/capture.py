"""Copies one named tensor out of a llama.cpp graph as it is computed, with the C eval callback in capture.c.

`make setup` compiles capture.c into `_capture.so` beside this file (the one-file binary carries it).
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from kafila.engine.llama_lib import GGML_TYPE_F32, ggml
from kafila.errors import EngineError

LIBRARY = Path(__file__).with_name("_capture.so")


class _State(ctypes.Structure):
    _fields_ = [
        ("get_name", ctypes.c_void_p),
        ("tensor_get", ctypes.c_void_p),
        ("target", ctypes.c_char * 64),
        ("dest", ctypes.c_void_p),
        ("capacity", ctypes.c_int64),
        ("hits", ctypes.c_int32),
        ("type", ctypes.c_int32),
        ("ne", ctypes.c_int64 * 4),
        ("tensor_set", ctypes.c_void_p),
        ("restore", ctypes.c_char * 64),
        ("src", ctypes.c_void_p),
        ("src_n", ctypes.c_int64),
        ("restored", ctypes.c_int32),
    ]


@cache
def _library() -> ctypes.CDLL:
    if not LIBRARY.is_file():
        raise EngineError(f"the stage engine's C helper {LIBRARY.name} is missing: run `make setup`")
    return ctypes.CDLL(str(LIBRARY))


class TensorCapture:
    """Eval-callback state that copies tensor `name` (float32, up to `rows` × `width`) into a buffer.

    `name` "" captures nothing. With `restore`, the node of that name is overwritten by the rows
    given to `set_input` once computed (Gemma 1/2's unconditional input scale, undone exactly).
    """

    def __init__(self, name: str, rows: int, width: int, restore: str = "") -> None:
        lib, g = _library(), ggml()
        self.width = width
        self._out = np.empty((rows, width), np.float32)
        self._input = np.empty((rows, width), np.float32)  # kept here: C reads it during the call
        self._state = _State(
            ctypes.cast(g.ggml_get_name, ctypes.c_void_p), ctypes.cast(g.ggml_backend_tensor_get, ctypes.c_void_p),
            name.encode(), self._out.ctypes.data, self._out.size,
        )
        self._state.tensor_set = ctypes.cast(g.ggml_backend_tensor_set, ctypes.c_void_p)
        self._state.restore = restore.encode()
        self._state.src = self._input.ctypes.data
        self.callback = ctypes.cast(lib.kafila_capture_eval, ctypes.c_void_p)
        self.user_data = ctypes.cast(ctypes.pointer(self._state), ctypes.c_void_p)

    def install(self, params: Any, callback_type: Any) -> None:
        """Point llama context params at this capture (they must not outlive it)."""
        params.cb_eval = ctypes.cast(self.callback, callback_type)
        params.cb_eval_user_data = self.user_data

    def reset(self) -> None:
        self._state.hits = 0
        self._state.restored = 0

    def set_input(self, rows: np.ndarray) -> None:
        """The rows the restore target gets back in the next call (float32, n × width)."""
        n = len(rows)
        self._input[:n] = rows
        self._state.src_n = n * self.width

    def check_restored(self) -> None:
        """EngineError unless the restore target (when there is one) was overwritten exactly once."""
        s = self._state
        if s.restore and s.restored != 1:
            raise EngineError(f"{s.restore.decode()} was restored {s.restored} time(s) in one call, not once")

    def rows(self, n: int) -> np.ndarray:
        """The captured (n, width) rows; EngineError unless exactly that was computed, once."""
        s = self._state
        ne = tuple(s.ne)
        if s.hits != 1 or s.type != GGML_TYPE_F32 or ne != (self.width, n, 1, 1):
            name = s.target.decode()
            raise EngineError(f"{name} was not captured whole: expected float32 ({self.width}, {n}) once, "
                              f"got {s.hits} time(s), type {s.type}, shape {ne}")
        return self._out[:n].copy()

"""The few llama.cpp / ggml entry points the stage engine needs beyond llama-cpp-python's bindings.

llama.cpp's logger is process-wide; it is routed into Python's `logging` so that nothing writes
into a terminal that Textual owns (`Llama(verbose=False)` swaps file descriptors instead).
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from typing import Any

log = logging.getLogger("kafila.llama")

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont
# llama.cpp warns about every stub vocabulary a body stage carries, so its warnings are INFO here.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.ERROR}

# struct ggml_tensor starts: enum ggml_type type; (pad); ggml_backend_buffer * buffer; int64_t ne[4]
# (capture.c reads type and ne from there)
GGML_TYPE_F32 = 0


@cache
def llama() -> Any:
    """The llama_cpp low-level module, initialised once with its logging routed to Python."""
    import llama_cpp

    @llama_cpp.llama_log_callback
    def _route(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        msg = text.decode("utf-8", "replace").rstrip()
        if msg:
            log.log(_LEVELS.get(level, logging.DEBUG), msg)

    # The callback must outlive every llama.cpp call: keep it on the module object.
    llama_cpp._kafila_log_callback = _route  # type: ignore[attr-defined]
    llama_cpp.llama_log_set(_route, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return llama_cpp


@cache
def ggml() -> ctypes.CDLL:
    """libggml, as llama-cpp-python loaded it (capture.c calls two of its functions)."""
    llama()
    from llama_cpp import _ggml

    lib: ctypes.CDLL = _ggml.libggml
    return lib

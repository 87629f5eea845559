"""Keep everything but Textual off the terminal while the dashboard owns it.

llama.cpp's C code and any stray print write to file descriptors 1 and 2 directly; a single line
there would tear the screen. While the TUI runs, fds 1 and 2 point at a log file, and Textual is
handed duplicates of the real terminal through `sys.__stdout__`/`sys.__stderr__` (its driver writes
to `sys.__stderr__` and sizes the screen from `sys.__stdout__`). Python logging goes to the same file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def own_terminal(log_path: Path) -> Iterator[None]:
    """Route fds 1/2 and logging to `log_path` for the duration; Textual keeps the real terminal."""
    if not (sys.__stdout__ and sys.__stderr__ and sys.__stdout__.isatty() and sys.__stderr__.isatty()):
        yield  # not a terminal (tests, pipes): nothing to protect
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.__stdout__.flush()
    sys.__stderr__.flush()
    saved = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    term_out = open(os.dup(1), "w", encoding="utf-8", errors="replace", closefd=True)
    term_err = open(os.dup(2), "w", encoding="utf-8", errors="replace", closefd=True)
    root = logging.getLogger()
    old_handlers = root.handlers[:]
    with open(log_path, "a", encoding="utf-8") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        handler = logging.StreamHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        root.handlers = [handler]
        sys.stdout = sys.__stdout__ = term_out  # type: ignore[misc]
        sys.stderr = sys.__stderr__ = term_err  # type: ignore[misc]
        try:
            yield
        finally:
            root.handlers = old_handlers
            sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = saved  # type: ignore[misc]
            os.dup2(term_out.fileno(), 1)
            os.dup2(term_err.fileno(), 2)
            term_out.close()
            term_err.close()

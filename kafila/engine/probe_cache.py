"""The engine probe, cached per machine and llama.cpp build for a day, and taken one process at a time.

Several members started together on one machine (the demo) must not time each other's noise: the probe
runs once per machine and build and is kept for a day, and processes with caches of their own take turns,
each holding a per-user lock of the whole machine (`machine_lock`) so that it is timed alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kafila.engine.build import build_identity, build_tag
from kafila.engine.probe import LARGE_SHAPE, ProbeResult
from kafila.engine.probe_process import POLL_S, probe_isolated
from kafila.errors import EngineError
from kafila.model.random_gguf import Shape
from kafila.model.stage_cache import StageCache

# v6: routed experts' prefill (v5 attention over the context, v4 unembedding on two vocabularies, v3 prefill)
PROBE_FILE_PREFIX = "probe-v6-"
PROBE_MAX_AGE_S = 24 * 3600  # an older probe is measured again


def machine_lock_path() -> Path:
    """The per-user lock every Kafila probe on this machine holds: in the temporary directory, not a cache
    (each process may have a cache of its own, and they all share the cores)."""
    return Path(tempfile.gettempdir()) / f"kafila-probe-{getpass.getuser()}.lock"


@contextlib.contextmanager
def machine_lock(on_wait: Callable[[], None] | None = None, stop: threading.Event | None = None) -> Iterator[None]:
    """Hold the machine's probe lock; `on_wait()` once if another process holds it. flock: the kernel frees it
    when its holder dies, even by kill -9. Polled, so that setting `stop` ends the wait (EngineError)."""
    with machine_lock_path().open("a") as lock:
        waited = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                if stop is None:
                    time.sleep(POLL_S)
                elif stop.wait(POLL_S):
                    raise EngineError("the probe was stopped") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _saved(path: Path, tag: str) -> ProbeResult | None:
    try:
        saved = json.loads(path.read_text())
        if saved["build"] == tag and time.time() - saved["time"] < PROBE_MAX_AGE_S:
            return ProbeResult.from_dict(saved["result"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def cached_probe(model: Path, cache: StageCache, on_step: Callable[[str, int, int], None] | None = None,
                 fresh: bool = False, threads: int = 0, large_shape: Shape = LARGE_SHAPE,
                 on_wait: Callable[[], None] | None = None, stop: threading.Event | None = None) -> ProbeResult:
    """The engine probe on `threads` threads (0: all), reused from the cache when recent and from this build.

    `large_shape`: the block shape of the probe's large-block cuts (tests pass a small one to save disk);
    `on_wait()`: called once if another process's probe holds the machine first; `stop`: ends it (EngineError)."""
    tag = build_tag(build_identity())
    # one file per build: members of two builds on one machine must not overwrite each other's
    path = cache.root / f"{PROBE_FILE_PREFIX}{threads or 'all'}-threads-{tag.replace('/', '-')}.json"
    if not fresh and (result := _saved(path, tag)) is not None:
        return result
    with machine_lock(on_wait, stop):
        # a process sharing this cache may have measured while we waited (the demo's members)
        if not fresh and (result := _saved(path, tag)) is not None:
            return result
        result = probe_isolated(model, cache, on_step=on_step, threads=threads, large_shape=large_shape, stop=stop)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".probe.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"build": tag, "time": time.time(), "result": result.as_dict()}))
    os.replace(tmp, path)
    return result

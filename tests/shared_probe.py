"""The probe shared by this machine's tests: its result for runs that need not probe, its model for those that must.

Several test runs share the directory at once (engineers on one machine, a loop beside a suite): each
reads or writes it holding one lock (`locked`), so one run probes, or writes the model, while the
others wait and then read what it wrote. Files were already written atomically, so none read half a
file; without the lock, every run that found the probe old or missing measured at once, each timing
the others' probes and each keeping its own numbers for a day. Keyed per run, every run would probe
(30 s, 140 s loaded); keyed per checkout, runs from one working tree would still collide. The probe's
file name already holds the llama.cpp build and the probe's format version, so checkouts of other
builds or formats never read each other's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".lock"  # in the shared directory: held while a run reads or writes it


def _shared_dir() -> Path:
    """A per-user directory under the system's temporary one, shared by every test on this machine."""
    import getpass
    import tempfile

    return Path(tempfile.gettempdir()) / f"kafila-test-probe-{getpass.getuser()}"


@contextlib.contextmanager
def locked(shared: Path) -> Iterator[None]:
    """Hold the shared directory's lock (flock: the kernel releases it when a holder dies, even by kill -9)."""
    import fcntl

    shared.mkdir(parents=True, exist_ok=True)
    with (shared / LOCK_NAME).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def shared_probe(cache_root: Path, threads: int = 0) -> None:
    """Put this machine's probe on `threads` threads (0: all) into a session's cache, so its members do not measure.

    One probe for all members of a test (as `kafila demo` does), and one for all tests on this
    machine for a day, as a real member keeps it (kafila.session.member.measure.cached_probe): measured in
    the shared directory, written atomically, then copied here, all under the shared lock. It took
    30 s (140 s on a loaded machine) per test when every test measured again.
    """
    import shutil

    from kafila.model.embedded import default_model_path
    from kafila.model.random_gguf import TEST_SHAPE
    from kafila.model.stage_cache import StageCache
    from kafila.session.member.measure import cached_probe

    shared = _shared_dir()
    with locked(shared):
        # large-block cuts of a small wide model, not the 8B shape: tests time nothing, and disk is shared
        cached_probe(default_model_path(), StageCache(shared), threads=threads, large_shape=TEST_SHAPE)
        cache_root.mkdir(parents=True, exist_ok=True)
        for probe in shared.glob("probe-*.json"):
            shutil.copyfile(probe, cache_root / probe.name)


def shared_probe_model(cache_root: Path) -> None:
    """The real probe's large-block model (840 MB) in `cache_root`, for a run that must probe afresh (a bench).

    Written once in the shared directory (under the shared lock: one run writes it, the others wait for
    it) and hard-linked here: written into every test's fresh cache it cost 11 s and 840 MB of disk
    per test, 21 GB in one suite run.
    """
    import shutil

    from kafila.engine.probe import LARGE_SHAPE, LARGE_SIZES, MODELS_FOLDER
    from kafila.model.random_gguf import cached_random_gguf

    shared = _shared_dir()
    with locked(shared):
        made = cached_random_gguf(LARGE_SHAPE, max(LARGE_SIZES), shared / MODELS_FOLDER)
    here = cache_root / MODELS_FOLDER / made.name
    here.parent.mkdir(parents=True, exist_ok=True)
    if not here.exists():
        try:
            os.link(made, here)
        except OSError:  # another file system
            shutil.copyfile(made, here)

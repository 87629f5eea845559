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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafila.engine.probe import ProbeResult

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
    machine for a day, as a real member keeps it (kafila.engine.probe_cache.cached_probe): measured in
    the shared directory, written atomically, then copied here, all under the shared lock. It took
    30 s (140 s on a loaded machine) per test when every test measured again.
    """
    import shutil

    from kafila.engine.probe_cache import cached_probe
    from kafila.model.embedded import default_model_path
    from kafila.model.random_gguf import TEST_SHAPE
    from kafila.model.stage_cache import StageCache

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


def sample_probe() -> ProbeResult:
    """A made-up probe result with every field set (not a measurement): prefill costs 0.15 s a block plus
    bytes / 6e7 B/s."""
    from kafila.engine.probe import ProbeResult

    return ProbeResult(2e10, 1e-4, 10**9, 2 * 10**9, 10**8, ((10**6, 1e-4), (10**7, 5e-4)), 0.01, 2e-4, 1e10,
                       block_s=1e-4, sample_blocks=(1, 4), prefill_rows=128, prefill_bandwidth_bytes_per_s=6e7,
                       prefill_dispatch_s=0.0, prefill_block_s=0.15, prefill_samples=((10**6, 0.2), (10**7, 0.7)),
                       prefill_fit_residual=0.02, prefill_sample_blocks=(1, 4), unembed_s=3e-4,
                       unembed_samples=((3 * 10**7, 2e-3), (3 * 10**8, 2e-2)), prefill_attn_s=3e-12,
                       attention_samples=(0.02, 0.05), expert_rates=(("Q4_0", 4e7), ("MXFP4", 3e7)),
                       expert_samples=(("Q4_0", 2 * 10**7, 10**7, 0.75), ("MXFP4", 4 * 10**7, 2 * 10**7, 1.75)))

"""The probe shared by this machine's tests: its result for runs that need not probe, its model for those that must."""

from __future__ import annotations

import os
from pathlib import Path


def _shared_dir() -> Path:
    """A per-user directory under the system's temporary one, shared by every test on this machine."""
    import getpass
    import tempfile

    return Path(tempfile.gettempdir()) / f"kafila-test-probe-{getpass.getuser()}"


def shared_probe(cache_root: Path, threads: int = 0) -> None:
    """Put this machine's probe on `threads` threads (0: all) into a session's cache, so its members do not measure.

    One probe for all members of a test (as `kafila demo` does), and one for all tests on this
    machine for a day, as a real member keeps it (kafila.session.member.measure.cached_probe): measured in
    the shared directory, written atomically, then copied here. It took 30 s (140 s on a loaded
    machine) per test when every test measured again.
    """
    import shutil

    from kafila.model.embedded import default_model_path
    from kafila.model.random_gguf import TEST_SHAPE
    from kafila.model.stage_cache import StageCache
    from kafila.session.member.measure import cached_probe

    # large-block cuts of a small wide model, not the 8B shape: tests time nothing, and disk is shared
    cached_probe(default_model_path(), StageCache(_shared_dir()), threads=threads, large_shape=TEST_SHAPE)
    cache_root.mkdir(parents=True, exist_ok=True)
    for probe in _shared_dir().glob("probe-*.json"):
        shutil.copyfile(probe, cache_root / probe.name)


def shared_probe_model(cache_root: Path) -> None:
    """The real probe's large-block model (840 MB) in `cache_root`, for a run that must probe afresh (a bench).

    Written once in the shared directory and hard-linked here: written into every test's fresh
    cache it cost 11 s and 840 MB of disk per test, 21 GB in one suite run.
    """
    import shutil

    from kafila.engine.probe import LARGE_SHAPE, LARGE_SIZES, MODELS_FOLDER
    from kafila.model.random_gguf import cached_random_gguf

    made = cached_random_gguf(LARGE_SHAPE, max(LARGE_SIZES), _shared_dir() / MODELS_FOLDER)
    here = cache_root / MODELS_FOLDER / made.name
    here.parent.mkdir(parents=True, exist_ok=True)
    if not here.exists():
        try:
            os.link(made, here)
        except OSError:  # another file system
            shutil.copyfile(made, here)

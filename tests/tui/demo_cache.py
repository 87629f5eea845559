"""A demo's cache for a test: its own, never the user's, seeded with the probe the ring tests share
(tests/shared_probe.py) on the threads the demo's members use, so the demo neither probes afresh (a full
probe and its 840 MB model) nor writes the user's cache; and the check, once the demo stopped, that so it was."""

from __future__ import annotations

from pathlib import Path


def seeded_demo_cache(cache: Path) -> Path:
    """`cache`, holding the shared probe the demo's members would otherwise measure."""
    from kafila.session.launch.demo import DemoOptions
    from tests.shared_probe import shared_probe

    shared_probe(cache, DemoOptions().member_threads())
    return cache


def probe_files(cache: Path) -> dict[str, bytes]:
    """The probe results in a cache, by file name."""
    return {p.name: p.read_bytes() for p in cache.glob("probe-*.json")}


def assert_demo_ran_in(cache: Path, seeded: dict[str, bytes]) -> None:
    """The demo ran in `cache` (its logs are there) on the probe seeded there: its probe files are as seeded,
    and the probe's large-block model, written only by a probe run afresh, is absent."""
    from kafila.engine.probe import MODELS_FOLDER

    assert (cache / "demo-logs" / "rendezvous.log").is_file(), sorted(p.name for p in cache.iterdir())
    assert seeded and probe_files(cache) == seeded, sorted(probe_files(cache))
    assert not (cache / MODELS_FOLDER).exists(), "the demo probed afresh"

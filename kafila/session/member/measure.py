"""A member's measurements for its announcement: the engine probe (cached), emulation, build identity.

The probe runs once per machine and llama.cpp build and is cached for a day, so several members
started together on one machine (the demo) do not time each other's noise. Processes with caches of
their own take turns: each probe holds a per-user lock of the whole machine (`machine_lock`), so it is
timed alone. Emulation (`--throttle`, `--memory`) is applied on top and always reported as such.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity
from kafila.engine.probe import LARGE_SHAPE, ProbeResult
from kafila.engine.probe_process import POLL_S, probe_isolated
from kafila.errors import EngineError
from kafila.model.random_gguf import Shape
from kafila.model.stage_cache import StageCache
from kafila.session.coordinator.builds import build_tag, wire_protocol
from kafila.session.delivery.cache_inventory import PROBE_MAX_AGE_S

# v6: routed experts' prefill (v5 attention over the context, v4 unembedding on two vocabularies, v3 prefill)
PROBE_FILE_PREFIX = "probe-v6-"


@dataclass(frozen=True)
class Emulation:
    """Slow-down and memory cap applied to a member on one machine; labelled 'emulated' everywhere."""

    throttle: float = 1.0
    memory_gb: float | None = None
    link_delay_ms: float = 0.0

    def as_dict(self) -> dict[str, float]:
        d: dict[str, float] = {}
        if self.throttle != 1.0:
            d["throttle"] = self.throttle
        if self.memory_gb is not None:
            d["memory_gb"] = self.memory_gb
        if self.link_delay_ms:
            d["link_delay_ms"] = self.link_delay_ms
        return d


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


def machine_id() -> str:
    """A short, stable name for this machine (not the id itself): equal for members that share its cores.

    The systemd/D-Bus machine id where there is one, else the kernel's boot id (containers on one host
    share it), else the host name.
    """
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return hashlib.sha256(text.encode()).hexdigest()[:12]
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12]


def _sig(x: float) -> float:
    """`x` to 4 significant digits: a probe's noise is far larger, and 17 digits a number would crowd
    the announcement's one datagram (e.g. 1.2345678901234567e-05 -> 1.235e-05)."""
    return float(f"{x:.4g}")


def measurements(result: ProbeResult, emulation: Emulation) -> dict[str, Any]:
    """The announcement's measurement block (kept small: it travels in one UDP datagram)."""
    t = emulation.throttle
    memory = result.memory_bytes
    if emulation.memory_gb is not None:
        memory = min(memory, int(emulation.memory_gb * 1e9))
    gpu = {"gpu": result.device} if result.device else {}  # its memory is then the GPU's (engine/devices.py)
    return {
        **gpu,
        "bw": round(result.bandwidth_bytes_per_s / t),
        "ubw": round(result.unembed_bandwidth_bytes_per_s / t),
        "uo": _sig(result.unembed_s * t),  # the unembedding's fixed seconds besides its bytes
        "disp": _sig(result.dispatch_s * t),
        "blk": _sig(result.block_s * t),  # seconds per block per call besides its bytes (DESIGN §2c)
        "mem": memory,
        # prefill at `prow` rows per call, the same three terms (the planner's TTFT, kafila.planner.ttft)
        "pbw": round(result.prefill_bandwidth_bytes_per_s / t),
        "pdisp": _sig(result.prefill_dispatch_s * t),
        "pblk": _sig(result.prefill_block_s * t),
        "prow": result.prefill_rows,
        "patt": _sig(result.prefill_attn_s * t),  # per row, earlier position and unit of attention width
        # routed experts' rows per expert weight type (those no slower than dense left out)
        "pebw": {kind: round(rate / t) for kind, rate in result.expert_rates if rate > 0},
        "samples": [round(b / s / t) for b, s in result.samples],
        **identity(emulation),
    }


def identity(emulation: Emulation) -> dict[str, Any]:
    """What a member announces before it has measured: its machine, emulation, build and protocol (the
    host refuses another build or protocol at once, not after the member's minutes of measuring)."""
    return {
        "mach": machine_id(),  # members on one machine do not compute in parallel (the planner's TTFT)
        "emu": emulation.as_dict(),
        "build": build_tag(build_identity()),
        "proto": wire_protocol(),  # must match the host's in every mode (kafila.session.coordinator.builds)
    }

"""A member's announcement: its machine, emulation, build, wire protocol and measurements, in one datagram.

The planner reads the measurements back (kafila.session.coordinator.planning.planner_member); emulation
(`--throttle`, `--memory`) is applied on top of the probe's numbers and always reported as such.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity, build_tag
from kafila.engine.probe import ProbeResult
from kafila.net.quic import ALPN
from kafila.net.trust import ANNOUNCE_VERSION
from kafila.session.protocol.frames import VERSION as FRAME_VERSION
from kafila.session.protocol.messages import CONTROL_VERSION


def wire_protocol() -> str:
    """The protocol versions this Kafila speaks, as announced (link ALPN, frames, announcements, control)."""
    return f"{ALPN} frames/{FRAME_VERSION} announce/{ANNOUNCE_VERSION} control/{CONTROL_VERSION}"


@dataclass(frozen=True)
class Emulation:
    """Slow-down, memory cap, link delay and link rate applied to a member on one machine; labelled 'emulated'
    everywhere."""

    throttle: float = 1.0
    memory_gb: float | None = None
    link_delay_ms: float = 0.0
    link_up_mbit: float = 0.0  # its connection's emulated rates (`--link-rate`); 0: not limited
    link_down_mbit: float = 0.0

    def as_dict(self) -> dict[str, float | list[float]]:
        d: dict[str, float | list[float]] = {}
        if self.throttle != 1.0:
            d["throttle"] = self.throttle
        if self.memory_gb is not None:
            d["memory_gb"] = self.memory_gb
        if self.link_delay_ms:
            d["link_delay_ms"] = self.link_delay_ms
        if self.link_up_mbit:  # up and down, 3 significant digits: the announcement's datagram is nearly full
            d["link_mbit"] = [_mbit(self.link_up_mbit), _mbit(self.link_down_mbit)]
        return d


def _mbit(x: float) -> float:
    """A rate to 3 significant digits, and without a '.0' when whole (100000.0 -> 100000)."""
    r = float(f"{x:.3g}")
    return int(r) if r.is_integer() else r


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
        "proto": wire_protocol(),  # must match the host's in every mode (coordinator.builds.judge_member)
    }

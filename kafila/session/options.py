"""Options of the session flows (filled from the command line, the TUI, or tests)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from kafila.errors import SessionError
from kafila.net.rate import LinkRate
from kafila.session.settings import SessionSettings

DEFAULT_RENDEZVOUS = ("127.0.0.1", 3478)
DEFAULT_API_PORT = 8711


def parse_addr(text: str, default_port: int = DEFAULT_RENDEZVOUS[1]) -> tuple[str, int]:
    """'host:port' or 'host' → (ip, port), resolving a name once."""
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(default_port))
    try:
        return socket.gethostbyname(host or text), int(port)
    except (OSError, ValueError):
        raise SessionError(f"cannot use rendezvous address {text!r}: expected HOST:PORT") from None


# EMULATION: the longest one-way delay `--link-delay` adds (a round trip of 2 s; a link's idle timeout is 5 s)
MAX_LINK_DELAY_MS = 1000.0


@dataclass(frozen=True)
class MemberOptions:
    """How `kafila join` takes part in a session."""

    code: str
    rendezvous: tuple[str, int] = DEFAULT_RENDEZVOUS
    name: str = field(default_factory=socket.gethostname)
    bind: tuple[str, int] = ("0.0.0.0", 0)
    api_port: int | None = DEFAULT_API_PORT  # None: no local chat endpoint
    throttle: float = 1.0  # emulated slow-down (1 = none)
    # emulated slow-down changing while serving: (seconds since first serving, factor), from (0, throttle)
    throttle_schedule: tuple[tuple[float, float], ...] = ()
    memory_gb: float | None = None  # emulated memory cap
    link_delay_ms: float = 0.0  # emulated one-way delay of every datagram this member sends (a far member)
    link_rate: LinkRate | None = None  # emulated uplink and downlink of this machine (`--link-rate`)
    cache_dir: Path | None = None
    join_timeout_s: float = 60.0
    link_idle_timeout_s: float = 5.0  # a silent peer is declared lost after this long
    allow_direct: bool = True
    trace_path: Path | None = None  # as the head: record every batch (for exactness tests)
    threads: int = 0  # llama.cpp threads (0: all cores); several members on one machine must share them
    model: Path | None = None  # this machine's own copy of the host's model: the stage is cut here, not sent
    draft: Path | None = None  # a draft model sharing the model's vocabulary: it drafts when this member is the head


@dataclass(frozen=True)
class HostOptions:
    """How `kafila host` runs a session."""

    model: Path | None = None  # None: the embedded SmolLM2
    rendezvous: tuple[str, int] = DEFAULT_RENDEZVOUS
    members: int = 3  # how many members to wait for, besides the host's own machine
    coordinate_only: bool = False  # True: this machine holds no stage (the ring is the members alone)
    name: str = field(default_factory=socket.gethostname)  # the host's machine's name as a ring member
    threads: int = 0  # llama.cpp threads of the host's own stage (0: all cores)
    wait_s: float = 120.0  # for members to arrive; then plan with whoever joined (at least one)
    # how the session runs, on this coordinator and any that takes over from it (sent in every assignment)
    settings: SessionSettings = field(default_factory=SessionSettings)
    api_port: int | None = DEFAULT_API_PORT
    bind: tuple[str, int] = ("0.0.0.0", 0)
    cache_dir: Path | None = None
    link_idle_timeout_s: float = 5.0
    allow_direct: bool = True
    label: str | None = None  # the model's name to show (None: from its file; a copy's file is named by its hash)
    draft: Path | None = None  # the host's own machine's draft model (MemberOptions.draft)
    link_rate: LinkRate | None = None  # emulated uplink and downlink of this machine, shared by its own member

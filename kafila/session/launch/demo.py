"""The demo session on one machine: a rendezvous, the host (in this process) and three members, on loopback.

Members run as separate processes (`kafila join`), each with an emulated slow-down, so the planner
sees a heterogeneous fleet; everything else is the real thing (QUIC over UDP, the rendezvous, stage
delivery, llama.cpp).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kafila.engine.probe_cache import cached_probe
from kafila.engine.variant import env_for
from kafila.errors import SessionError
from kafila.model.embedded import default_model_path
from kafila.model.stage_cache import StageCache
from kafila.net.ports import free_udp_pair
from kafila.process import PARENT_ENV
from kafila.session.launch.host import run_host
from kafila.session.options import DEFAULT_API_PORT, HostOptions
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState

log = logging.getLogger("kafila.demo")
STOP_GRACE_S = 5.0
START_TIMEOUT_S = 60.0  # for the rendezvous to listen and the host to open its session
RENDEZVOUS_READY = b"rendezvous listening on"  # the line the rendezvous logs once its sockets are bound
READY_POLL_S = 0.05
# Several members share this machine: their OpenMP threads must not spin long after a call
# (libgomp spins ~300k iterations by default), or they steal the cores the next stage computes on.
JOIN_CODE_ENV = "KAFILA_JOIN_CODE"  # read by `kafila join` without a code argument (kafila.commands.join)
SHARED_MACHINE_ENV = {"GOMP_SPINCOUNT": "10000"}


@dataclass(frozen=True)
class DemoMember:
    """One emulated member: its name, slow-down factor and (optional) memory cap."""

    name: str
    throttle: float = 1.0
    memory_gb: float | None = None
    llama_path: Path | None = None  # a second llama-cpp-python build to run on (kafila.engine.variant)
    link_delay_ms: float = 0.0  # every datagram it sends leaves this much later (a member far away)
    throttle_schedule: str = ""  # its slow-down changing while it serves, as `kafila join --throttle-schedule`
    link_rate: str = ""  # its connection's emulated rate, as `kafila join --link-rate` takes it


DEFAULT_MEMBERS = (DemoMember("ada", 1.0), DemoMember("bo", 2.0), DemoMember("cy", 4.0))


@dataclass(frozen=True)
class DemoOptions:
    """What `kafila demo` (and `kafila tui --demo`) starts."""

    model: Path | None = None
    members: tuple[DemoMember, ...] = DEFAULT_MEMBERS
    concurrency: int = 4
    context: int = 2048
    api_port: int | None = DEFAULT_API_PORT
    cache_dir: Path | None = None
    log_dir: Path | None = None  # members' and rendezvous' output (default: <cache>/demo-logs)
    strategy: str = "kafila"
    fresh_probe: bool = False  # measure again even when a recent probe is cached
    threads: int | None = None  # llama.cpp threads per member (default: the cores shared out among them)
    mixed_builds: bool = False  # the host admits members of another llama.cpp build (then not bit-exact)
    speculate: str = "auto"  # the head's speculation (session/ring/speculation.py)
    chat_template: str | None = None  # replaces the model's chat template (SessionSettings.chat_template)
    draft: Path | None = None  # a draft model every member may use as the head

    def member_threads(self) -> int:
        """Threads per member: members on one machine compute at once, and ggml's threads spin-wait at
        every op, so more threads than cores in all makes every member crawl."""
        return self.threads or max(1, (os.cpu_count() or 1) // len(self.members))


def kafila_argv() -> list[str]:
    """How to start another kafila process: the frozen binary itself, or this interpreter on kafila.py."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, str(Path(__file__).resolve().parents[3] / "kafila.py")]


async def _start(argv: list[str], log_path: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env={**os.environ, **env}
        )


def _last_line(log_path: Path) -> str:
    """The last line a process wrote to its log (its error, when it failed)."""
    try:
        with log_path.open("rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - 4096, 0))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


async def _watch(proc: asyncio.subprocess.Process, name: str, log_path: Path, state: SessionState) -> None:
    """Say in the session's log when a member's process ends by itself (a crash shows only in its own log)."""
    code = await proc.wait()
    how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    state.log(f"member {name}'s process ended ({how}); the last line of {log_path}: {_last_line(log_path)}")


async def _start_rendezvous(argv: list[str], log_path: Path, env: dict[str, str],
                            procs: list[asyncio.subprocess.Process]) -> None:
    """Start the rendezvous (added to `procs`, to be stopped) and return once its log says it listens.

    Its output goes straight to the log file, read back here: a pipe copied by a task outlived the
    process when the demo was cancelled, and was collected after its event loop had closed.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    seen = log_path.stat().st_size if log_path.exists() else 0  # the log is appended to: this run's lines only
    proc = await _start(argv, log_path, env)
    procs.append(proc)
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                with log_path.open("rb") as log:
                    log.seek(seen)
                    if RENDEZVOUS_READY in log.read():
                        return
                if proc.returncode is not None:
                    raise SessionError(f"the demo's rendezvous stopped before it listened (see {log_path})")
                await asyncio.sleep(READY_POLL_S)
    except TimeoutError:
        raise SessionError(f"the demo's rendezvous did not listen within {START_TIMEOUT_S:.0f} s") from None


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    """Terminate the processes and wait for them (killed after STOP_GRACE_S); killed at once if this is
    cancelled, so an interrupted clean-up leaves none running."""
    try:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
    except BaseException:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        raise


async def run_demo(opts: DemoOptions, state: SessionState) -> int:
    """Run the demo session until the host ends it (or the task is cancelled); returns the host's status."""
    cache = StageCache(opts.cache_dir)
    log_dir = opts.log_dir or cache.root / "demo-logs"
    # members share this cache (the probe and the stage files) and this machine's cores
    # ... and end with this process, however it ends (kafila.process)
    env = {"KAFILA_CACHE_DIR": str(cache.root), **SHARED_MACHINE_ENV, PARENT_ENV: str(os.getpid())}
    state.log("measuring this machine once for all members")
    threads = opts.member_threads()
    await asyncio.to_thread(cached_probe, default_model_path(), cache, None, opts.fresh_probe, threads)
    port = free_udp_pair()
    procs: list[asyncio.subprocess.Process] = []
    watchers: list[asyncio.Task[None]] = []
    code_known = asyncio.Event()
    state.subscribe(lambda s: code_known.set() if s.code is not None else None)
    try:
        async with asyncio.TaskGroup() as tg:  # owns the host
            host: asyncio.Task[int] | None = None
            try:
                await _start_rendezvous([*kafila_argv(), "rendezvous", "--host", "127.0.0.1", "--port", str(port)],
                                        log_dir / "rendezvous.log", env, procs)
                settings = SessionSettings(concurrency=opts.concurrency, context=opts.context, strategy=opts.strategy,
                                           mixed_builds=opts.mixed_builds, speculate=opts.speculate,
                                           chat_template=opts.chat_template)
                host = tg.create_task(run_host(HostOptions(
                    model=opts.model, rendezvous=("127.0.0.1", port), members=len(opts.members), wait_s=120.0,
                    settings=settings, api_port=opts.api_port, cache_dir=cache.root,
                    coordinate_only=True,  # the ring is the emulated members: the host's own would be a fourth
                ), state))
                code_wait = tg.create_task(code_known.wait())
                await asyncio.wait({host, code_wait}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
                code_wait.cancel()
                if not host.done():
                    if state.code is None:
                        raise SessionError(f"the demo's host did not open a session within {START_TIMEOUT_S:.0f} s")
                    state.log(f"starting members {', '.join(m.name for m in opts.members)} (emulated slow-downs "
                              f"{', '.join(f'×{m.throttle:g}' for m in opts.members)}); logs in {log_dir}")
                    for m in opts.members:
                        # the code goes in the member's environment, not its argv, where `ps` shows it to anyone
                        argv = [*kafila_argv(), "join", "--rendezvous", f"127.0.0.1:{port}", "--name",
                                m.name, "--api-port", "-1", "--throttle", str(m.throttle), "--threads", str(threads)]
                        if m.memory_gb is not None:
                            argv += ["--memory", str(m.memory_gb)]
                        if m.link_delay_ms:
                            argv += ["--link-delay", str(m.link_delay_ms)]
                        if m.link_rate:
                            argv += ["--link-rate", m.link_rate]
                        if m.throttle_schedule:
                            argv += ["--throttle-schedule", m.throttle_schedule]
                        if opts.draft is not None:
                            argv += ["--draft", str(opts.draft)]
                        member_env = {**env, JOIN_CODE_ENV: state.code}
                        if m.llama_path is not None:
                            member_env = env_for(m.llama_path, {**os.environ, **member_env})
                        procs.append(await _start(argv, log_dir / f"{m.name}.log", member_env))
                        watchers.append(asyncio.create_task(_watch(procs[-1], m.name, log_dir / f"{m.name}.log",
                                                                   state)))
                    await asyncio.wait({host})
            finally:
                for w in watchers:  # the demo's own stopping of its members is no news
                    w.cancel()
                if host is not None:
                    host.cancel()  # no-op once it has ended; else it ends with the demo
                try:
                    await _stop(procs[1:])  # the members first: they may still say goodbye through it
                finally:
                    await _stop(procs[:1])
    except BaseExceptionGroup as group:  # as the host raised it, not wrapped in the demo's own group
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    assert host is not None
    return host.result()

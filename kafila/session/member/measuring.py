"""A member measuring its machine while connected to its host: the host hears how it goes, the member hears
the host leave.

A member connects before it measures (a fresh machine's probe takes minutes), announcing
messages.MEASURING_KEY:
the host then knows it has arrived and waits for its measurements (kafila.session.coordinator.admission).
A host that ends meanwhile is heard at once, with its reason, and the probe is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kafila.engine.probe import ProbeResult
from kafila.errors import EngineError, KafilaError, NetworkError, ProtocolError, SessionError
from kafila.net.quic import Link
from kafila.session.member.machine import log
from kafila.session.protocol import messages
from kafila.session.state import SessionState

WAITING = "waiting for another Kafila process's measurement on this machine"
PROGRESS_GAP_S = 1.0  # at most one progress message a second (a probe's steps come every call)
HEARTBEAT_S = 5.0  # and at least one every this, so the host's "so far" stays current
ATTEMPT_RE = re.compile(r"\(attempt (\d+) of \d+\)")  # in the probe's step text (kafila.engine.probe)

# the probe to run: (on_step, on_wait, stop) -> its result, in a thread (member.join gives cached_probe)
Probe = Callable[[Callable[[str, int, int], None], Callable[[], None], threading.Event], ProbeResult]


@dataclass
class Progress:
    """The latest of a member's measurement, as it tells its host."""

    step: str = "measuring this machine"
    attempt: int = 0
    waiting: bool = False


async def measure_connected(control: Link, state: SessionState, probe: Probe) -> ProbeResult:
    """Run `probe` while telling the host on `control` how it goes; SessionError as soon as the host goes."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    stop = threading.Event()
    now = Progress()
    changed = asyncio.Event()

    def update(step: str, waiting: bool) -> None:
        attempt = int(m.group(1)) if (m := ATTEMPT_RE.search(step)) else now.attempt
        if attempt != now.attempt or waiting != now.waiting:  # the steps a person follows; the rest is noise
            state.set_phase("measuring", step)
        now.step, now.attempt, now.waiting = step, attempt, waiting
        changed.set()

    def on_step(text: str, done: int, total: int) -> None:  # in the probe's thread
        loop.call_soon_threadsafe(update, text, False)

    def on_wait() -> None:
        loop.call_soon_threadsafe(update, WAITING, True)

    async def report() -> None:
        while True:
            changed.clear()
            elapsed = loop.time() - started
            with contextlib.suppress(KafilaError):  # a link gone is heard by host_gone
                await control.send(messages.encode(messages.Measuring(now.step, now.attempt, now.waiting, elapsed)))
            await asyncio.sleep(PROGRESS_GAP_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), HEARTBEAT_S - PROGRESS_GAP_S)

    measuring = asyncio.ensure_future(asyncio.to_thread(probe, on_step, on_wait, stop))
    gone = asyncio.ensure_future(host_gone(control))
    reporting = asyncio.ensure_future(report())
    try:
        await asyncio.wait({measuring, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gone.done():
            raise gone.result()
        try:
            return measuring.result()
        except EngineError as exc:  # the host hears why, not only that the link closed
            with contextlib.suppress(KafilaError):
                control.post(messages.encode(messages.Bye(f"its measurement failed: {exc}")))
            raise
    finally:
        stop.set()  # the probe's child is killed within its poll (kafila.engine.probe_process.POLL_S)
        gone.cancel()
        reporting.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait({measuring}, timeout=5.0)
        if measuring.done() and not measuring.cancelled():
            measuring.exception()  # the stopped probe's error is no news: the host's going is


async def host_gone(control: Link) -> SessionError:
    """Why the host ended this member's session while it measured: its goodbye or refusal, or the link's end."""
    while True:
        try:
            msg = messages.decode(await control.recv())
        except NetworkError as exc:
            return SessionError(f"the session's host has gone: {exc}")
        except ProtocolError as exc:
            log.warning("ignored a malformed message from the host: %s", exc)
            continue
        if isinstance(msg, messages.Bye):
            return SessionError(f"the session's host has gone: {msg.reason}")
        if isinstance(msg, messages.Refused):
            return SessionError(f"the session was refused: {msg.reason}")
        log.warning("ignored a %r message from the host while measuring", msg.T)

"""NAT-behaviour probing against the rendezvous, and classification from the evidence (DESIGN §4).

Probe order (it matters; see DESIGN §4 and reference/natlab.md):

1. echo to A:P                      -> M1 (mapped address), RTT, the server's OTHER-ADDRESS (B)
2. filtering, BEFORE anything is sent to another server address or port:
   ask A:P to answer from B:P+1 (change IP and port) and from A:P+1 (change port), together.
   Any answer heard means endpoint-independent filtering -> permissive. (Without an alternate
   IP only the change-port test exists; it still tells permissive from the rest.)
3. mapping: echo to A:P+1 -> M2 and to B:P -> M3. M2 or M3 != M1 -> restrictive.
   Otherwise -> ordinary. No answer to step 1, or no answer at all in step 3 -> unknown.

Each exchange is one datagram, resent once when unanswered (`tries`), so one lost datagram
is not read as "filtered".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kafila.net import stun
from kafila.planner.reachability import NatClass

Addr = tuple[str, int]
# (destination, CHANGE-REQUEST flags, timeout per try, tries) -> the answer, or None when none was heard
StunRequester = Callable[[Addr, int, float, int], Awaitable[stun.StunMessage | None]]


@dataclass(frozen=True)
class NatReport:
    """The class and the evidence it was drawn from."""

    nat_class: NatClass
    mapped: Addr | None  # M1: what the rendezvous primary saw
    mapped_alt_port: Addr | None  # M2
    mapped_alt_ip: Addr | None  # M3 (None when the rendezvous has no second IP)
    heard_change_ip_port: bool
    heard_change_port: bool
    rendezvous_alt_ip: str | None
    rtt_ms: float | None
    probe_s: float

    def summary(self) -> str:
        """One line for logs and the TUI."""
        return (
            f"{self.nat_class.value}: mapped {self.mapped} / alt-port {self.mapped_alt_port} / alt-ip "
            f"{self.mapped_alt_ip}; answer from changed ip+port heard: {self.heard_change_ip_port}, "
            f"from changed port: {self.heard_change_port}; rtt {self.rtt_ms} ms"
        )


def classify(
    mapped: Addr | None,
    mapped_alt_port: Addr | None,
    mapped_alt_ip: Addr | None,
    heard_change_ip_port: bool,
    heard_change_port: bool,
) -> NatClass:
    """The class from the evidence alone (pure; the probe order is the caller's job)."""
    if mapped is None:
        return NatClass.UNKNOWN
    if heard_change_ip_port or heard_change_port:
        return NatClass.PERMISSIVE
    seen = [m for m in (mapped_alt_port, mapped_alt_ip) if m is not None]
    if not seen:
        return NatClass.UNKNOWN
    if any(m != mapped for m in seen):
        return NatClass.RESTRICTIVE
    return NatClass.ORDINARY


async def probe(request: StunRequester, primary: Addr, timeout_s: float = 0.3, tries: int = 2) -> NatReport:
    """Run the probe sequence against the rendezvous at `primary` (ip, P) and classify."""
    t0 = time.monotonic()
    first = await request(primary, 0, timeout_s, tries + 1)  # an extra try costs nothing when answered
    if first is None or first.mapped is None:
        return NatReport(NatClass.UNKNOWN, None, None, None, False, False, None, None, time.monotonic() - t0)
    rtt_ms = round((time.monotonic() - t0) * 1000.0, 3)
    alt_ip = first.other[0] if first.other else None
    host, port = primary
    # Filtering first: both requests go to the primary address only.
    tests = [request(primary, stun.CHANGE_PORT, timeout_s, tries)]
    if alt_ip:
        tests.append(request(primary, stun.CHANGE_IP | stun.CHANGE_PORT, timeout_s, tries))
    heard = await asyncio.gather(*tests)
    heard_port = heard[0] is not None
    heard_ip_port = len(heard) > 1 and heard[1] is not None
    # Only now may anything be sent to the alternate port / address.
    maps = [request((host, port + 1), 0, timeout_s, tries)]
    if alt_ip:
        maps.append(request((alt_ip, port), 0, timeout_s, tries))
    answers = await asyncio.gather(*maps)
    m2 = answers[0].mapped if answers[0] else None
    m3 = answers[1].mapped if len(answers) > 1 and answers[1] else None
    cls = classify(first.mapped, m2, m3, heard_ip_port, heard_port)
    return NatReport(cls, first.mapped, m2, m3, heard_ip_port, heard_port, alt_ip, rtt_ms, time.monotonic() - t0)

"""The member's link to its coordinator: the host found among the session's verified members, and connected.

A coordinator that does not answer is passed over for another (a killed host stays listed for a while).
Every member says in its announcement which coordinator it follows (COORD_KEY: the first 8 bytes of its
certificate's fingerprint), and a member joining late follows the one most members follow: a member who
holds the join code and announces itself as a host cannot draw the late joiners away from the session's
real coordinator (it would need more members behind it than the real one has).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kafila.errors import NetworkError, SessionError
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember

log = logging.getLogger("kafila.member")
COORD_KEY = "coord"  # the announcement's measurement naming the coordinator a member follows


def coordinator_mark(fingerprint: bytes) -> str:
    """How announcements name a coordinator: its certificate fingerprint's first 8 bytes, in hex."""
    return fingerprint[:8].hex()


async def announce_following(ep: PeerEndpoint, coordinator: VerifiedMember,
                             measurements: dict[str, Any] | None = None) -> None:
    """Announce again (with new `measurements`, or the last ones), saying that this member follows
    `coordinator` (late joiners count such members)."""
    if ep.me is not None:
        now = ep.me.measurements if measurements is None else measurements
        await ep.announce({**now, COORD_KEY: coordinator_mark(coordinator.fingerprint)})


async def find_host(ep: PeerEndpoint, timeout_s: float, gone: frozenset[bytes] = frozenset(),
                    name: str | None = None, fingerprint: bytes | None = None) -> VerifiedMember:
    """The session's host (its coordinator) among the verified members.

    The rendezvous answers requests and never pushes, so the member list is asked for again (backing
    off to once a second) until the host is on it. The host announces itself before its join code
    exists, so the first answer almost always has it. After a takeover: the coordinator named `name` with
    the certificate `fingerprint` (the heir's, from the roster: not whoever poses as it), never one of the
    `gone` (a lost coordinator stays listed until the rendezvous drops it as silent).
    """
    delay = 0.05
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                listed = (await ep.members()).verified
                hosts = [vm for vm in listed if vm.measurements.get("role") == "host" and vm.member_id not in gone
                         and name in (None, vm.name) and fingerprint in (None, vm.fingerprint)]
                if hosts:  # the one most members follow (at the start: none yet, the first listed)
                    votes = [vm.measurements.get(COORD_KEY) for vm in listed if vm.measurements.get("role") != "host"]
                    return max(hosts, key=lambda vm: votes.count(coordinator_mark(vm.fingerprint)))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
    except TimeoutError:
        raise SessionError(f"the session's host did not appear within {timeout_s:.0f} s (has it ended?)") from None


async def connect_host(ep: PeerEndpoint, timeout_s: float) -> Link:
    """A link to the session's coordinator; one that does not answer is passed over for another.

    A host killed stays listed at the rendezvous until it drops it as silent, beside the member that
    took coordination over: a member joining then (a restarted host's machine, say) may find it first.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    gone: set[bytes] = set()
    failed: NetworkError | None = None
    while True:
        try:
            host = await find_host(ep, max(0.0, deadline - loop.time()), frozenset(gone))
        except SessionError:
            if failed is not None:  # the one coordinator listed does not answer: say so, not that none is listed
                raise failed from None
            raise
        try:
            return await ep.connect(host)
        except NetworkError as exc:
            log.info("the coordinator %s does not answer (%s); looking for another", host.name, exc)
            gone.add(host.member_id)
            failed = exc

"""The member's link to its coordinator: the coordinator found among the session's verified members, and connected.

A coordinator is known by its certificate, bound to the join code (the host made the code's secret from its
certificate) or mandated by a coordinator that was (kafila.net.mandate), never by how many members say they
follow it: a member who holds the join code and announces itself as a host, with any number of member ids
behind it, is not a coordinator to anyone. A coordinator that does not answer is passed over for another (a
killed host stays listed for a while).
"""

from __future__ import annotations

import asyncio
import logging

from kafila.errors import NetworkError, ProtocolError, SessionError
from kafila.net.endpoint import PeerEndpoint
from kafila.net.mandate import CREDENTIAL_KEY, Credential, verify
from kafila.net.quic import Link
from kafila.net.trust import JoinCode, VerifiedMember

log = logging.getLogger("kafila.member")


def credential_of(vm: VerifiedMember, code: JoinCode) -> Credential | None:
    """The credential `vm` announced when it proves `vm` coordinates the session of `code`; else None."""
    try:
        credential = Credential.from_json(vm.measurements.get(CREDENTIAL_KEY))
    except ProtocolError:
        return None
    return credential if verify(credential, code, vm.fingerprint) else None


async def find_host(ep: PeerEndpoint, timeout_s: float, gone: frozenset[bytes] = frozenset(),
                    name: str | None = None, fingerprint: bytes | None = None) -> VerifiedMember:
    """The session's host (its coordinator) among the verified members.

    The rendezvous answers requests and never pushes, so the member list is asked for again (backing
    off to once a second) until the host is on it. The host announces itself before its join code
    exists, so the first answer almost always has it. Only a coordinator whose certificate the join code
    binds, or a mandate chain from one, counts (credential_of), the shortest chain first: the host while it
    answers. After a takeover: the coordinator named `name` with the certificate `fingerprint` (the heir's,
    from the roster its coordinator sent: not whoever poses as it), never one of the `gone` (a lost
    coordinator stays listed until the rendezvous drops it as silent).
    """
    delay = 0.05
    code = ep.code
    if code is None:
        raise SessionError("join a session before looking for its coordinator")
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                listed = (await ep.members()).verified
                hosts = [vm for vm in listed if vm.measurements.get("role") == "host" and vm.member_id not in gone
                         and name in (None, vm.name) and fingerprint in (None, vm.fingerprint)]
                if fingerprint is None:  # pinned by the roster: that certificate; else proven by the join code
                    proven = [(len(c.links), vm) for vm in hosts if (c := credential_of(vm, code)) is not None]
                    hosts = [vm for _, vm in sorted(proven, key=lambda p: p[0])]
                if hosts:
                    return hosts[0]
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

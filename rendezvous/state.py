"""The rendezvous's records: sessions, their members, and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from rendezvous.limits import Addr

# nonces a wrong re-join MAC spends that a member's record keeps (a re-join that verifies is always kept): a
# stranger can spend only the nonces issued to its own address, and one it re-uses past this gives it only
# another guess at a 256-bit MAC
MAX_SPENT_GUESSES = 8


@dataclass
class Member:
    """One member's registration."""

    member_id: bytes
    addr: Addr  # where relayed packets and answers go
    local: Addr  # our socket it registered through
    last_seen: float
    reg_key: bytes = field(repr=False, default=b"")
    # re-join nonces already used (rendezvous.nonces), each until it would be stale anyway: single use
    spent: dict[bytes, float] = field(default_factory=dict)
    announcement: str | None = None
    counted: int = 0  # the highest op counter taken (kafila.net.registration.signed)
    counters: set[int] = field(default_factory=set)  # those taken within the window below it


@dataclass
class Session:
    """One session: the join key's public half from the host, members by id."""

    session_id: str
    join_pub: bytes
    created: float
    last_active: float
    owner: str = ""  # net_key of the creator, for the per-network session cap
    # the first two addresses that joined (each showed its cookie): a second one means the session is in use
    join_addrs: set[Addr] = field(default_factory=set)
    members: dict[bytes, Member] = field(default_factory=dict)


@dataclass
class Stats:
    """Counters for logs and tests."""

    probes: int = 0
    requests: int = 0
    relayed: int = 0
    relayed_bytes: int = 0
    dropped: int = 0
    malformed: int = 0
    rate_limited: int = 0
    rejoins: int = 0

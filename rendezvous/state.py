"""The rendezvous's records: sessions, their members, and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from rendezvous.limits import Addr

# What the table counts for each session and member, announcements aside: above what tracemalloc measures (about
# 1.2 kB a session with its entries in the table's indexes; 1.0 kB a member with its address and expiry entries,
# and up to 0.9 kB more of spent nonces), which tests/rendezvous/test_room.py checks
SESSION_BYTES = 1_500
MEMBER_BYTES = 2_400


def announcement_bytes(ann: str | None) -> int:
    """What a member's announcement adds (a str of it: its characters and about 50 bytes of object)."""
    return 0 if ann is None else len(ann) + 64


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
    # those taken within the window below it, a bit each (bit i: counted - i): a set of them cost 4 kB a member
    window: int = 0

    def take(self, n: int, width: int) -> bool:
        """Take op counter `n` once: False when it was taken, or is `width` or more below the highest taken."""
        back = self.counted - n
        if back >= width or (back >= 0 and self.window >> back & 1):
            return False
        if back < 0:  # a new highest: the window slides up
            self.window = (self.window << -back | 1) & ((1 << width) - 1) if -back < width else 1
            self.counted = n
        else:
            self.window |= 1 << back
        return True


@dataclass
class Session:
    """One session: the join key's public half from the host, members by id."""

    session_id: str
    join_pub: bytes
    created: float
    last_active: float
    owner: str = ""  # net_key of the creator, for the per-network session cap
    block: str = ""  # block_key of the creator, for the per-block caps
    # the first two addresses that joined (each showed its cookie): until a second one, it expires soon
    join_addrs: set[Addr] = field(default_factory=set)
    # the first two sites (site_key) that joined: a second one means the session is in use, never dropped for room
    join_sites: set[str] = field(default_factory=set)
    members: dict[bytes, Member] = field(default_factory=dict)
    size: int = SESSION_BYTES  # what it holds, as the table counts it (session_bytes)


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

"""Every bound the rendezvous enforces (Limits), and the token buckets that apply its rates."""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections import OrderedDict
from dataclasses import dataclass

from kafila.net import wire

Addr = tuple[str, int]
_HEADER = struct.Struct("!BI")  # a control message's kind and request id (kafila.net.wire)


@dataclass(frozen=True)
class Limits:
    """Every bound the rendezvous enforces."""

    # Sessions in all; and the bytes they may hold, announcements counted (rendezvous.state's sizes: a session
    # of 16 members with the largest announcements counts 60.8 kB and holds 33 kB, 47 kB with every member's
    # spent nonces, so the bytes bound first: at 8,824 such sessions, the process at 344-488 MiB; `kafila bench
    # rendezvous`)
    max_sessions: int = 100_000
    max_table_bytes: int = 512 << 20
    # live sessions created from one network (an IPv4 /24, an IPv6 /48): a flood from many addresses of
    # one network takes this many, not the table
    max_sessions_per_net: int = 64
    # and from one block of networks (an IPv4 /16, an IPv6 /32: about what one provider hands out), sessions
    # and bytes: one party holding a whole IPv6 /37 (1,563 /48s) pins 1,024 sessions, not the table
    max_sessions_per_block: int = 1024
    max_block_bytes: int = 32 << 20
    max_members: int = 16
    member_timeout_s: float = 30.0  # silent this long -> removed (members re-join every few seconds)
    empty_session_ttl_s: float = 60.0  # a session nobody is in (its creator left or never joined)
    # A session only its creator ever joined: longer than a host's default 120 s wait for its
    # members, short enough that sessions made to fill the table do not outlive the attempt.
    unjoined_session_ttl_s: float = 600.0
    session_max_age_s: float = 24 * 3600.0
    max_datagram: int = wire.MAX_DATAGRAM
    # Every request (control ops and STUN probes) from one ip:port and from one IP (or /64).
    # Legitimate peaks: a member polling `list` 5/s; a campus NAT hiding hundreds of members.
    source_burst: float = 100.0
    source_rate: float = 50.0  # per second
    ip_burst: float = 5000.0
    ip_rate: float = 2000.0
    # Creates and joins (they make state) pass a second, tighter pair of buckets.
    join_source_burst: float = 10.0
    join_source_rate: float = 2.0
    join_ip_burst: float = 600.0
    join_ip_rate: float = 100.0
    relay_burst: float = 20000.0  # relayed datagrams per member (about 24 MB at 1.2 kB)
    relay_rate: float = 20000.0  # per second: ~190 Mbit/s per member, more than this process can forward
    max_buckets: int = 20000
    max_cached_replies: int = 8192
    list_page_bytes: int = 1200


def ip_key(ip: str) -> str:
    """What one party controls: an IPv4 address, or an IPv6 /64 (one subscriber's prefix)."""
    if ":" not in ip:
        return ip  # IPv4, as the socket layer spells it: the common case, kept cheap
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def net_key(ip: str) -> str:
    """The network one party is likely to hold many addresses of: an IPv4 /24, an IPv6 /48."""
    return _prefix(ip, 24, 48)


def block_key(ip: str) -> str:
    """A block of networks, about what one provider hands out: an IPv4 /16, an IPv6 /32."""
    return _prefix(ip, 16, 32)


def site_key(ip: str) -> str:
    """One site (a LAN behind one NAT, a subscriber): an IPv4 /24, an IPv6 /64. A session joined from two of
    them is in use: two ports, or two addresses, of one network make none."""
    return _prefix(ip, 24, 64)


def _prefix(ip: str, v4: int, v6: int) -> str:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(ipaddress.ip_network((addr, v4 if addr.version == 4 else v6), strict=False))


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class RateLimiter:
    """Token buckets per source address and per IP (or /64), least recently used dropped first."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._buckets: OrderedDict[object, _Bucket] = OrderedDict()

    def allow(self, src: Addr, now: float) -> bool:
        """Take one token for any request from src; False when either bucket is empty."""
        lim = self.limits
        return self._take(("ip", ip_key(src[0])), lim.ip_burst, lim.ip_rate, now) and self._take(
            ("src", src), lim.source_burst, lim.source_rate, now
        )

    def allow_join(self, src: Addr, now: float) -> bool:
        """Take one token for a create or join from src; False when either bucket is empty."""
        lim = self.limits
        return self._take(("join-ip", ip_key(src[0])), lim.join_ip_burst, lim.join_ip_rate, now) and self._take(
            ("join-src", src), lim.join_source_burst, lim.join_source_rate, now
        )

    def allow_relay(self, member_id: bytes, now: float) -> bool:
        """Take one token for a datagram relayed from this member."""
        return self._take(("relay", member_id), self.limits.relay_burst, self.limits.relay_rate, now)

    def _take(self, key: object, burst: float, rate: float, now: float) -> bool:
        b = self._buckets.get(key)
        if b is None:
            b = _Bucket(burst, now)
            self._buckets[key] = b
            while len(self._buckets) > self.limits.max_buckets:
                self._buckets.popitem(last=False)
        else:
            # least recently *used* goes first: a busy IP's bucket must not be evicted (and
            # refilled) by that IP spraying new source ports
            self._buckets.move_to_end(key)
        b.tokens = min(burst, b.tokens + max(0.0, now - b.stamp) * rate)
        b.stamp = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    def __len__(self) -> int:
        return len(self._buckets)


def bounded_refusal(request_id: int, code: str, text: str, limit: int) -> bytes | None:
    """A failure reply no larger than the request (`limit` bytes): its text dropped, or None, if need be."""
    for body in _refusal_bodies(code, text):
        if _HEADER.size + len(body) <= limit:
            return _HEADER.pack(wire.RESPONSE, request_id & 0xFFFFFFFF) + body
    return None


@functools.lru_cache(maxsize=256)
def _refusal_bodies(code: str, text: str) -> tuple[bytes, bytes]:
    """The JSON of a refusal with and without its text; cached, as floods repeat the same few."""
    full = wire.encode_control(wire.RESPONSE, 0, {"ok": False, "code": code, "error": text})[_HEADER.size :]
    return full, wire.encode_control(wire.RESPONSE, 0, {"ok": False, "code": code})[_HEADER.size :]

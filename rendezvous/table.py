"""The rendezvous's sessions and their members' addresses, with the bounds that keep room for a new host.

At most `max_sessions` sessions and `max_table_bytes` of them (rendezvous.state's sizes, announcements
counted); per creator's network (an IPv4 /24, an IPv6 /48) `max_sessions_per_net` live ones, and per block
of networks (an IPv4 /16, an IPv6 /32) `max_sessions_per_block` and `max_block_bytes`. A session is in use
once two sites (an IPv4 /24, an IPv6 /64) have joined it: two ports or two addresses of one network, which
a single party has at hand, make none. When the table is full (sessions or bytes), a session not in use
is dropped for a new one or a larger one: one of the network holding the most sessions
(rendezvous.evict), its idlest one no second address joined first. So a flood of creates and joins, even
from many real addresses, cannot lock a new host out unless it holds addresses in many networks and blocks.
A session no second address joined expires after `unjoined_session_ttl_s` (a group behind one NAT joins
from two ports of it: it stays).

Expiry looks only at what is due: every member and session has one entry in a heap of the times it
could next expire, checked when that time comes and pushed again for later if it did not. A scan of a
full table every second took 250 ms of the rendezvous's time.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import Counter

from kafila.errors import RendezvousBusy
from kafila.net.trust import SESSION_ID_LEN, random_b32
from rendezvous.evict import Evictable
from rendezvous.limits import Addr, Limits, block_key, net_key, site_key
from rendezvous.state import MEMBER_BYTES, SESSION_BYTES, Member, Session, announcement_bytes

log = logging.getLogger("kafila.rendezvous")


class SessionTable:
    """Sessions by id, and which (session, member) each relay address belongs to."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.sessions: dict[str, Session] = {}
        self.by_addr: dict[Addr, tuple[str, bytes]] = {}
        self.size = 0  # bytes the sessions hold, as counted (Session.size)
        self._per_block: Counter[str] = Counter()  # and per creator's block
        self._block_size: Counter[str] = Counter()  # bytes per creator's block
        self._evictable = Evictable()  # live sessions per creator's network, and those that may be dropped for room
        # (when it could expire, entry number, session id, the member or None for the session itself); a
        # session's entry is the one numbered in _session_entry (an earlier one, replaced, is skipped)
        self._due: list[tuple[float, int, str, Member | None]] = []
        self._session_entry: dict[str, int] = {}
        self._seq = itertools.count()

    def add(self, join_pub: bytes, ip: str, now: float, asked: str | None = None) -> Session:
        """A new session (under `asked`, its id before a restart, when given) created from address `ip`;
        RendezvousBusy when its network or block has its share, or the table is full of sessions in use."""
        owner, block = net_key(ip), block_key(ip)
        if self._evictable.live[owner] >= self.limits.max_sessions_per_net:
            raise RendezvousBusy("too many sessions from this network; end one or try later", "full")
        if self._per_block[block] >= self.limits.max_sessions_per_block or \
                self._block_size[block] + SESSION_BYTES > self.limits.max_block_bytes:
            raise RendezvousBusy("too many sessions from this block of networks; end one or try later", "full")
        self._make_room(SESSION_BYTES, sessions=1)
        sid = asked or random_b32(SESSION_ID_LEN)
        while sid in self.sessions:
            sid = random_b32(SESSION_ID_LEN)
        s = self.sessions[sid] = Session(sid, join_pub, now, now, owner, block)
        self._evictable.add(sid, owner)
        self._per_block[block] += 1
        self.size += s.size
        self._block_size[block] += s.size
        self._check_at(self._session_due(s)[0], s)
        return s

    def joined(self, s: Session, m: Member, src: Addr, local: Addr, now: float) -> None:
        """`m` joined `s` from `src` (whose cookie it showed); RendezvousBusy when the table has no room for it."""
        self._grow(s, MEMBER_BYTES + announcement_bytes(m.announcement))
        self._resize(s, MEMBER_BYTES + announcement_bytes(m.announcement))
        s.members[m.member_id] = m
        self._check_at(now + self.limits.member_timeout_s, s, m)
        if len(s.join_addrs) < 2:  # a second address: it no longer expires unjoined
            s.join_addrs.add(src)
            if len(s.join_addrs) == 2:
                self._evictable.second_address(s.session_id, s.owner)
        if len(s.join_sites) < 2:  # a second site makes it a session in use, never dropped for room
            s.join_sites.add(site_key(src[0]))
            if len(s.join_sites) == 2:
                self._evictable.in_use(s.session_id, s.owner)
        self.place(s, m, src, local, now)

    def announce(self, s: Session, m: Member, ann: str, now: float) -> None:
        """`m`'s announcement is `ann` now; RendezvousBusy when the table has no room for it."""
        self._grow(s, announcement_bytes(ann) - announcement_bytes(m.announcement))
        if m.announcement is not None:
            self._resize(s, -announcement_bytes(m.announcement))
        m.announcement, m.last_seen = ann, now
        self._resize(s, announcement_bytes(ann))
        self.touch(s, now)

    def place(self, s: Session, m: Member, src: Addr, local: Addr, now: float) -> None:
        """Make src the member's relay address: one address, one membership, the newest wins."""
        other = self.by_addr.get(src)
        if other is not None and other != (s.session_id, m.member_id):
            self.remove(other[0], other[1])
        if self.by_addr.get(m.addr) == (s.session_id, m.member_id):
            del self.by_addr[m.addr]
        m.addr, m.local, m.last_seen = src, local, now
        self.by_addr[src] = (s.session_id, m.member_id)
        self.touch(s, now)

    def touch(self, s: Session, now: float) -> None:
        """Something happened in `s` (the idlest session not in use goes first)."""
        s.last_active = now
        self._evictable.touch(s.session_id, s.owner)

    def remove(self, sid: str, mid: bytes) -> None:
        """Member `mid` leaves session `sid`."""
        s = self.sessions.get(sid)
        if s is None:
            return
        m = s.members.pop(mid, None)
        if m is not None:
            self._resize(s, -MEMBER_BYTES - announcement_bytes(m.announcement))
            if self.by_addr.get(m.addr) == (sid, mid):
                del self.by_addr[m.addr]
        if not s.members:  # it may be idle from now on
            self._check_at(self._session_due(s)[0], s)

    def drop(self, sid: str) -> None:
        """Session `sid` ends, with its members."""
        s = self.sessions.pop(sid)
        for mid in list(s.members):
            m = s.members.pop(mid)
            if self.by_addr.get(m.addr) == (sid, mid):
                del self.by_addr[m.addr]
        self._evictable.gone(sid, s.owner)
        self._session_entry.pop(sid, None)
        self.size -= s.size
        for counter, key, n in ((self._per_block, s.block, 1),
                                (self._block_size, s.block, s.size)):
            counter[key] -= n
            if counter[key] <= 0:
                del counter[key]

    def _grow(self, s: Session, more: int) -> None:
        """Room for `s` to hold `more` bytes (none needed when it holds less): RendezvousBusy when its block has
        its share, or the table is full of sessions in use; sessions not in use may be dropped for it."""
        if more <= 0:
            return
        if self._block_size[s.block] + more > self.limits.max_block_bytes:
            raise RendezvousBusy("the sessions of this block of networks hold too much; try later", "full")
        self._make_room(more, keep=s.session_id)

    def _make_room(self, more: int, sessions: int = 0, keep: str | None = None) -> None:
        """Drop sessions not in use (never `keep`), in rendezvous.evict's order, until `sessions` more sessions and
        `more` bytes fit; RendezvousBusy when they cannot."""
        lim = self.limits
        while len(self.sessions) + sessions > lim.max_sessions or self.size + more > lim.max_table_bytes:
            victim = next((sid for sid in self._evictable.candidates() if sid != keep), None)
            if victim is None:
                raise RendezvousBusy("the rendezvous is full (too many sessions); try later", "full")
            self.drop(victim)
            log.info("session %s dropped for room (full; no second site had joined it)", victim)

    def _resize(self, s: Session, by: int) -> None:
        s.size += by
        self.size += by
        self._block_size[s.block] += by

    def _check_at(self, when: float, s: Session, m: Member | None = None) -> None:
        n = next(self._seq)
        if m is None:
            self._session_entry[s.session_id] = n
        heapq.heappush(self._due, (when, n, s.session_id, m))

    def _session_due(self, s: Session) -> tuple[float, str]:
        """When `s` could next expire as it is now, and why (too old, unjoined or idle)."""
        lim = self.limits
        dues = [(s.created + lim.session_max_age_s, "too old")]
        if len(s.join_addrs) < 2:
            dues.append((s.created + lim.unjoined_session_ttl_s, "unjoined"))
        if not s.members:
            dues.append((s.last_active + lim.empty_session_ttl_s, "idle"))
        return min(dues)

    def expire(self, now: float) -> None:
        """Drop silent members, and idle, unjoined or too-old sessions (those whose time has come).

        What is due is decided by the very sum the entry was pushed with (never `now - t > ttl`, which
        rounding can make disagree with `t + ttl <= now`): an entry pushed again is always later than now."""
        while self._due and self._due[0][0] <= now:
            _, n, sid, m = heapq.heappop(self._due)
            s = self.sessions.get(sid)
            if s is None or (m is None and self._session_entry.get(sid) != n):
                continue  # dropped already, or a session entry that a newer one replaced
            if m is not None:
                if s.members.get(m.member_id) is not m:
                    continue  # gone already
                due = m.last_seen + self.limits.member_timeout_s
                if due <= now:
                    log.info("session %s: member %s went silent, removed", sid, m.member_id.hex()[:8])
                    self.remove(sid, m.member_id)
                else:
                    self._check_at(due, s, m)
                continue
            due, why = self._session_due(s)
            if due <= now:
                self.drop(sid)
                log.info("session %s expired (%s)", sid, why)
            else:
                self._check_at(due, s)

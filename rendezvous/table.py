"""The rendezvous's sessions and their members' addresses, with the bounds that keep room for a new host.

At most `max_sessions` sessions (a session is bytes: 100,000 is tens of MB) and `max_sessions_per_net`
live ones per creator's network (an IPv4 /24, an IPv6 /48). A session counts as in use once a second
address has joined it; until then it expires after `unjoined_session_ttl_s`, and when the table is full
the idlest such session is dropped for a new one. So a flood of creates, even from many real addresses,
cannot lock a new host out.

Expiry looks only at what is due: every member and session has one entry in a heap of the times it
could next expire, checked when that time comes and pushed again for later if it did not. A scan of a
full table every second took 250 ms of the rendezvous's time.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import Counter, OrderedDict

from kafila.errors import RendezvousBusy
from kafila.net.trust import SESSION_ID_LEN, random_b32
from rendezvous.limits import Addr, Limits
from rendezvous.state import Member, Session

log = logging.getLogger("kafila.rendezvous")


class SessionTable:
    """Sessions by id, and which (session, member) each relay address belongs to."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.sessions: dict[str, Session] = {}
        self.by_addr: dict[Addr, tuple[str, bytes]] = {}
        self._per_net: Counter[str] = Counter()  # live sessions per creator's network
        self._unjoined: OrderedDict[str, None] = OrderedDict()  # sessions no second address joined, idlest first
        # (when it could expire, entry number, session id, the member or None for the session itself); a
        # session's entry is the one numbered in _session_entry (an earlier one, replaced, is skipped)
        self._due: list[tuple[float, int, str, Member | None]] = []
        self._session_entry: dict[str, int] = {}
        self._seq = itertools.count()

    def add(self, join_pub: bytes, owner: str, now: float, asked: str | None = None) -> Session:
        """A new session (under `asked`, its id before a restart, when given) created from network `owner`;
        RendezvousBusy when that network has its share, or the table is full of sessions in use."""
        if self._per_net[owner] >= self.limits.max_sessions_per_net:
            raise RendezvousBusy("too many sessions from this network; end one or try later", "full")
        if len(self.sessions) >= self.limits.max_sessions:
            if not self._unjoined:
                raise RendezvousBusy("the rendezvous is full (too many sessions); try later", "full")
            idlest = next(iter(self._unjoined))  # made for nothing, or waiting longest for its members
            self.drop(idlest)
            log.info("session %s dropped for a new one (full; no second address had joined it)", idlest)
        sid = asked or random_b32(SESSION_ID_LEN)
        while sid in self.sessions:
            sid = random_b32(SESSION_ID_LEN)
        s = self.sessions[sid] = Session(sid, join_pub, now, now, owner)
        self._per_net[owner] += 1
        self._unjoined[sid] = None
        self._check_at(self._session_due(s)[0], s)
        return s

    def joined(self, s: Session, m: Member, src: Addr, local: Addr, now: float) -> None:
        """`m` joined `s` from `src` (whose cookie it showed)."""
        s.members[m.member_id] = m
        self._check_at(now + self.limits.member_timeout_s, s, m)
        if len(s.join_addrs) < 2:  # a second address makes it a session in use, never dropped for room
            s.join_addrs.add(src)
            if len(s.join_addrs) == 2:
                self._unjoined.pop(s.session_id, None)
        self.place(s, m, src, local, now)

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
        """Something happened in `s` (the idlest session waiting for a second address goes first)."""
        s.last_active = now
        if s.session_id in self._unjoined:
            self._unjoined.move_to_end(s.session_id)

    def remove(self, sid: str, mid: bytes) -> None:
        """Member `mid` leaves session `sid`."""
        s = self.sessions.get(sid)
        if s is None:
            return
        m = s.members.pop(mid, None)
        if m is not None and self.by_addr.get(m.addr) == (sid, mid):
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
        self._unjoined.pop(sid, None)
        self._session_entry.pop(sid, None)
        self._per_net[s.owner] -= 1
        if self._per_net[s.owner] <= 0:
            del self._per_net[s.owner]

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

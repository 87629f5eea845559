"""The rendezvous as a sans-I/O state machine: datagram in (with `now`), datagrams out.

It answers on every socket it is given (normally IP1:P, IP1:P+1, and IP2:P, IP2:P+1 with
--alt-ip). Three kinds of datagram arrive (see kafila.net.wire for the byte layouts):

* STUN Binding requests (kafila.net.stun): answered with the source address seen, from the
  socket the CHANGE-REQUEST flags ask for (other IP and/or other port); silently dropped
  when that socket does not exist. This is the NAT-behaviour probe responder.
* Control REQUESTs (0x10, JSON; the answer is a RESPONSE 0x11 with the same request id, from
  the socket it arrived on). Ops, with the fields each carries:

    create    {"op":"create", "token_hash": hex32}                  -> {"session": id}
    join      {"op":"join", "session", "member": hex8, "token": hex16}  -> {"members": n}
              registers the source address as the member's relay address
    announce  {"op":"announce", "session", "member", "ann": base64}  -> {}
              stores the member's sealed announcement; opaque here (MAC'd with a key this
              server never has, see kafila.net.trust)
    list      {"op":"list", "session", "member", "start": int}       -> {"total": n, "members":
              [{"id": hex8, "ann": base64, "obs": [ip, port]}, ...]}  paged to fit a datagram
    ping      {"op":"ping", "session", "member"}                     -> {"obs": [ip, port]}
              keeps the member (and its NAT mapping) alive
    leave     {"op":"leave", "session", "member"}                    -> {}

  Failures answer {"ok": false, "error": "<for a person>"}. Retries are safe: a repeated
  request id from the same source gets the cached answer.
* RELAY frames (0x20 to_id | payload): forwarded as RELAYED (0x21 from_id | payload) to the
  destination's relay address when sender (known by its source address) and destination are in
  the same session. The payload is never parsed: it is QUIC ciphertext or a MAC'd punch frame.

Everything is bounded (Limits): sessions, members per session, datagram sizes, join/create rate
per source address and per IP, relayed datagrams per member, the retry cache; silent members and
idle sessions expire. Nothing is queued: every answer or relayed datagram is sent at once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafila.errors import ProtocolError
from kafila.net import stun, wire
from kafila.net.trust import SESSION_ID_LEN, random_b32

log = logging.getLogger("kafila.rendezvous")

Addr = tuple[str, int]
Out = tuple[bytes, Addr, Addr]  # (datagram, local socket to send from, destination)


@dataclass(frozen=True)
class Limits:
    """Every bound the rendezvous enforces."""

    max_sessions: int = 1000
    max_members: int = 16
    member_timeout_s: float = 30.0  # silent this long -> removed (members ping every few seconds)
    empty_session_ttl_s: float = 300.0
    session_max_age_s: float = 24 * 3600.0
    max_datagram: int = wire.MAX_DATAGRAM
    per_source_burst: float = 10.0  # creates/joins from one ip:port
    per_source_rate: float = 2.0  # per second
    per_ip_burst: float = 600.0  # creates/joins from one IP (a campus NAT hides many members)
    per_ip_rate: float = 100.0
    relay_burst: float = 20000.0  # relayed datagrams per member (about 24 MB at 1.2 kB)
    relay_rate: float = 20000.0  # per second: ~190 Mbit/s per member, more than this process can forward
    max_buckets: int = 20000
    max_cached_replies: int = 8192
    list_page_bytes: int = 1200


@dataclass
class Member:
    """One member's registration."""

    member_id: bytes
    addr: Addr  # where relayed packets and answers go
    local: Addr  # our socket it registered through
    last_seen: float
    announcement: str | None = None


@dataclass
class Session:
    """One session: token hash from the host, members by id."""

    session_id: str
    token_hash: bytes
    created: float
    last_active: float
    members: dict[bytes, Member] = field(default_factory=dict)


@dataclass
class _Bucket:
    tokens: float
    stamp: float


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


class RequestError(Exception):
    """A control request that is well formed but refused; the message goes back to the member."""


class RendezvousCore:
    """Session registry, probe responder and relay table. No sockets, no clock: `now` comes in."""

    def __init__(self, sockets: list[Addr], limits: Limits | None = None) -> None:
        if not sockets:
            raise ValueError("the rendezvous needs at least one socket")
        self.sockets = list(sockets)
        self.limits = limits or Limits()
        self.sessions: dict[str, Session] = {}
        self.by_addr: dict[Addr, tuple[str, bytes]] = {}
        self.stats = Stats()
        self._buckets: OrderedDict[object, _Bucket] = OrderedDict()
        self._replies: OrderedDict[tuple[Addr, int], tuple[float, bytes]] = OrderedDict()
        self._last_expiry = float("-inf")
        ips = sorted({ip for ip, _ in self.sockets})
        ports = sorted({port for _, port in self.sockets})
        self._ips, self._ports = ips, ports
        self._handlers: dict[str, Callable[[dict[str, Any], Addr, Addr, float], dict[str, Any]]] = {
            "create": self._op_create,
            "join": self._op_join,
            "announce": self._op_announce,
            "list": self._op_list,
            "ping": self._op_ping,
            "leave": self._op_leave,
        }

    # ---- entry point -------------------------------------------------------------------

    def handle(self, data: bytes, src: Addr, local: Addr, now: float) -> list[Out]:
        """Process one datagram received on socket `local` from `src`; return what to send."""
        self.expire(now)
        if len(data) > self.limits.max_datagram or not data:
            self.stats.dropped += 1
            return []
        try:
            kind = wire.kind_of(data)
            if kind == "stun":
                return self._probe(data, src, local)
            if kind == "kafila":
                frame = wire.decode(data)
                if isinstance(frame, wire.Control) and frame.kind == wire.REQUEST:
                    return self._control(frame, src, local, now)
                if isinstance(frame, wire.Relay) and frame.kind == wire.RELAY:
                    return self._relay(frame, src, now)
            self.stats.dropped += 1  # QUIC or a frame type meant for members: not ours
            return []
        except ProtocolError as exc:
            self.stats.malformed += 1
            log.debug("malformed datagram from %s: %s", src, exc)
            return []

    # ---- probes --------------------------------------------------------------------------

    def _other(self, values: list[Any], current: Any) -> Any:
        others = [v for v in values if v != current]
        return others[0] if others else None

    def _probe(self, data: bytes, src: Addr, local: Addr) -> list[Out]:
        msg = stun.decode(data)
        if msg.msg_type != stun.BINDING_REQUEST:
            return []
        self.stats.probes += 1
        ip, port = local
        if msg.change & stun.CHANGE_IP:
            ip = self._other(self._ips, ip)
        if msg.change & stun.CHANGE_PORT:
            port = self._other(self._ports, port)
        origin = (ip, port)
        if ip is None or port is None or origin not in self.sockets:
            return []  # we cannot answer from there; the member reads silence as "not heard"
        other = None
        if len(self._ips) > 1:
            other = (self._other(self._ips, local[0]), self._other(self._ports, local[1]) or local[1])
        reply = stun.StunMessage(stun.BINDING_SUCCESS, msg.txid, mapped=src, origin=origin, other=other)
        return [(stun.encode(reply), origin, src)]

    # ---- control ---------------------------------------------------------------------------

    def _control(self, frame: wire.Control, src: Addr, local: Addr, now: float) -> list[Out]:
        self.stats.requests += 1
        key = (src, frame.request_id)
        cached = self._replies.get(key)
        if cached is not None and now - cached[0] < 30.0:
            return [(cached[1], local, src)]
        op = frame.body.get("op")
        handler = self._handlers.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise ProtocolError(f"unknown op {op!r}")
            body = {"ok": True, **handler(frame.body, src, local, now)}
        except (ProtocolError, RequestError) as exc:
            body = {"ok": False, "error": str(exc)}
        reply = wire.encode_control(wire.RESPONSE, frame.request_id, body)
        self._replies[key] = (now, reply)
        while len(self._replies) > self.limits.max_cached_replies:
            self._replies.popitem(last=False)
        return [(reply, local, src)]

    def _rate_ok(self, key: object, burst: float, rate: float, now: float) -> bool:
        b = self._buckets.get(key)
        if b is None:
            b = _Bucket(burst, now)
            self._buckets[key] = b
            while len(self._buckets) > self.limits.max_buckets:
                self._buckets.popitem(last=False)
        b.tokens = min(burst, b.tokens + (now - b.stamp) * rate)
        b.stamp = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    def _admit(self, src: Addr, now: float) -> None:
        lim = self.limits
        if not (
            self._rate_ok(("ip", src[0]), lim.per_ip_burst, lim.per_ip_rate, now)
            and self._rate_ok(("src", src), lim.per_source_burst, lim.per_source_rate, now)
        ):
            self.stats.rate_limited += 1
            raise RequestError("too many requests from this address; wait a moment and retry")

    def _session(self, body: dict[str, Any]) -> Session:
        sid = wire.get_str(body, "session", SESSION_ID_LEN)
        s = self.sessions.get(sid)
        if s is None:
            raise RequestError(f"no session {sid!r} here (expired, or the join code is mistyped)")
        return s

    def _member(self, body: dict[str, Any], src: Addr) -> tuple[Session, Member]:
        s = self._session(body)
        mid = wire.get_hex(body, "member", wire.ID_LEN)
        m = s.members.get(mid)
        if m is None:
            raise RequestError("not a member of this session (expired? join again)")
        if m.addr != src:
            raise RequestError("member registered from another address; join again")
        return s, m

    def _op_create(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        token_hash = wire.get_hex(body, "token_hash", 32)
        self._admit(src, now)
        if len(self.sessions) >= self.limits.max_sessions:
            raise RequestError("the rendezvous is full (too many sessions); try later")
        sid = random_b32(SESSION_ID_LEN)
        while sid in self.sessions:
            sid = random_b32(SESSION_ID_LEN)
        self.sessions[sid] = Session(sid, token_hash, now, now)
        log.info("session %s created from %s:%d", sid, *src)
        return {"session": sid}

    def _op_join(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s = self._session(body)
        mid = wire.get_hex(body, "member", wire.ID_LEN)
        token = wire.get_hex(body, "token", 16)
        self._admit(src, now)
        if not hmac.compare_digest(hashlib.sha256(token).digest(), s.token_hash):
            raise RequestError("wrong join code for this session")
        m = s.members.get(mid)
        if m is None:
            if len(s.members) >= self.limits.max_members:
                raise RequestError(f"session is full ({self.limits.max_members} members)")
            other = self.by_addr.get(src)
            if other is not None and other != (s.session_id, mid):
                self._remove(other[0], other[1])  # one address, one membership: the newest wins
            m = Member(mid, src, local, now)
            s.members[mid] = m
            log.info("session %s: member %s joined from %s:%d", s.session_id, mid.hex()[:8], *src)
        else:
            self.by_addr.pop(m.addr, None)
            m.addr, m.local, m.last_seen = src, local, now
        self.by_addr[src] = (s.session_id, mid)
        s.last_active = now
        return {"members": len(s.members)}

    def _op_announce(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._member(body, src)
        ann = wire.get_str(body, "ann", 1300)
        m.announcement, m.last_seen, s.last_active = ann, now, now
        return {}

    def _op_list(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._member(body, src)
        m.last_seen = now
        start = wire.get_int(body, "start", 0, self.limits.max_members)
        listed = [x for x in s.members.values() if x.announcement is not None]
        page: list[dict[str, Any]] = []
        size = 0
        for x in listed[start:]:
            entry = {"id": x.member_id.hex(), "ann": x.announcement, "obs": list(x.addr)}
            n = len(entry["ann"] or "") + 80
            if page and size + n > self.limits.list_page_bytes:
                break
            page.append(entry)
            size += n
        return {"total": len(listed), "start": start, "members": page}

    def _op_ping(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._member(body, src)
        m.last_seen, s.last_active = now, now
        return {"obs": list(src)}

    def _op_leave(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._member(body, src)
        self._remove(s.session_id, m.member_id)
        return {}

    # ---- relay -------------------------------------------------------------------------------

    def _relay(self, frame: wire.Relay, src: Addr, now: float) -> list[Out]:
        who = self.by_addr.get(src)
        s = self.sessions.get(who[0]) if who else None
        if who is None or s is None:
            self.stats.dropped += 1
            return []
        sender = s.members.get(who[1])
        target = s.members.get(frame.peer)
        if sender is None or target is None:
            self.stats.dropped += 1
            return []
        sender.last_seen = now  # relayed traffic also counts as the member being alive
        if not self._rate_ok(("relay", sender.member_id), self.limits.relay_burst, self.limits.relay_rate, now):
            self.stats.rate_limited += 1
            return []  # QUIC sees a loss and slows down
        self.stats.relayed += 1
        self.stats.relayed_bytes += len(frame.payload)
        return [(wire.encode_relay(wire.RELAYED, sender.member_id, frame.payload), target.local, target.addr)]

    # ---- expiry ------------------------------------------------------------------------------

    def _remove(self, sid: str, mid: bytes) -> None:
        s = self.sessions.get(sid)
        if s is None:
            return
        m = s.members.pop(mid, None)
        if m is not None and self.by_addr.get(m.addr) == (sid, mid):
            del self.by_addr[m.addr]

    def expire(self, now: float) -> None:
        """Drop silent members and idle or too-old sessions (at most once a second)."""
        if now - self._last_expiry < 1.0:
            return
        self._last_expiry = now
        lim = self.limits
        for sid, s in list(self.sessions.items()):
            for mid, m in list(s.members.items()):
                if now - m.last_seen > lim.member_timeout_s:
                    log.info("session %s: member %s went silent, removed", sid, mid.hex()[:8])
                    self._remove(sid, mid)
            too_old = now - s.created > lim.session_max_age_s
            idle = not s.members and now - s.last_active > lim.empty_session_ttl_s
            if too_old or idle:
                for mid in list(s.members):
                    self._remove(sid, mid)
                del self.sessions[sid]
                log.info("session %s expired", sid)
        for key, (t, _) in list(self._replies.items()):
            if now - t < 30.0:
                break
            del self._replies[key]


def new_request_id() -> int:
    """A random 32-bit request id."""
    return secrets.randbits(32)

"""The rendezvous as a sans-I/O state machine: datagram in (with `now`), datagrams out.

It answers on every socket it is given (normally IP1:P, IP1:P+1, and IP2:P, IP2:P+1 with
--alt-ip). Three kinds of datagram arrive (see kafila.net.wire for the byte layouts):

* STUN Binding requests (kafila.net.stun): answered with the source address seen, from the
  socket the CHANGE-REQUEST flags ask for (other IP and/or other port); silently dropped
  when that socket does not exist. This is the NAT-behaviour probe responder.
* Control REQUESTs (0x10, JSON; the answer is a RESPONSE 0x11 with the same request id, from
  the socket it arrived on). Ops, with the fields each carries:

    cookie    {"op":"cookie", "pad": 48+ characters}                -> {"cookie": hex16}
    create    {"op":"create", "join_pub": hex32[, "session": id]}   -> {"session": id}
              (create, join and rejoin also carry "cookie": hex16, see below)
              join_pub: the public half of the code's join key (kafila.net.trust); with "session":
              the members of a session this rendezvous forgot (it restarted) create it again under
              its id; a second such create with the same key answers the same, another key is
              refused ("wrong_code")
    join      {"op":"join", "session", "member": hex8, "proof": hex64}  -> {"members": n, "reg": hex32}
              proof: the join key's signature over session, member and cookie (kafila.net.registration),
              so nothing a join sends lets whoever sees it join; a first join only (a registered
              member id is refused, "member_exists"); registers the source address as the
              member's relay address and issues its registration key
    challenge {"op":"challenge", "session", "member"}                -> {"nonce": hex16}
    rejoin    {"op":"rejoin", "session", "member", "nonce": hex16, "mac": hex32}  -> {"members": n}
              moves the member's relay address to the source; MAC'd with the registration key
              over a nonce issued to that source (30 s, single use; stateless, so a challenge from
              elsewhere spoils none: rendezvous.nonces), see kafila.net.registration
    (announce, list, ping and leave also carry "n" and "mac": kafila.net.registration.signed)
    announce  {"op":"announce", "session", "member", "ann": base64}  -> {}
              stores the member's sealed announcement; opaque here (MAC'd with a key this
              server never has, see kafila.net.trust)
    list      {"op":"list", "session", "member", "start": int}       -> {"total": n, "members":
              [{"id": hex8, "ann": base64, "obs": [ip, port]}, ...]}  paged to fit a datagram
    ping      {"op":"ping", "session", "member"}                     -> {"obs": [ip, port]}
    leave     {"op":"leave", "session", "member"}                    -> {}

  Ops that place state for the source address (create, join, rejoin) first need its
  return-routability cookie (rendezvous.cookies): without a valid one the answer is only
  {"ok": false, "code": "cookie", "cookie": hex16}, no larger than the request, and the
  client sends the op again with it (a client asks for one with `cookie` first: a join signs
  it). So every address the rendezvous keeps, answers with more than was asked, or relays to,
  has shown that it reads what is sent to it.
  Success answers {"ok": true, ...}. Failures answer {"ok": false, "code": "<code>", "error":
  "<for a person>"} with a code from kafila.errors.RENDEZVOUS_CODES. A failure never echoes any
  of the request and is never larger than it: the text is dropped, then the whole answer, when
  it would be (so refusals cannot amplify a spoofed-source flood). Retries are safe: a repeated
  request id from the same source gets the cached answer.
* RELAY frames (0x20 to_id | payload): forwarded as RELAYED (0x21 from_id | payload) to the
  destination's relay address when sender (known by its source address) and destination are in
  the same session. The payload is never parsed: it is QUIC ciphertext or a MAC'd punch frame.

STUN answers, too, are never larger than the request (members pad theirs: kafila.net.stun).

Everything is bounded (rendezvous.limits.Limits): sessions and their bytes in all (when full, the idlest
session that no second site has joined is dropped for a new one: rendezvous.table), per network (/24, /48
for IPv6) and per block (/16, /32), members per session, datagram sizes, every request and probe per
source address and per IP, creates and joins tighter still, relayed datagrams per member, the retry
cache; silent members, sessions no second address joined, and idle sessions expire. Nothing is queued.
Records are in rendezvous.state, the session table and its eviction in rendezvous.table, every bound and
the buckets that apply it in rendezvous.limits.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kafila.errors import (
    CookieNeeded,
    MemberExists,
    NotMember,
    ProtocolError,
    RejoinRefused,
    RendezvousBusy,
    RendezvousError,
    UnknownSession,
    WrongJoinCode,
)
from kafila.net import registration, stun, wire
from kafila.net.registration import MESSAGES
from kafila.net.trust import SESSION_ID_LEN, valid_session_id
from rendezvous.cookies import Cookies
from rendezvous.limits import Addr, Limits, RateLimiter, bounded_refusal
from rendezvous.nonces import Nonces
from rendezvous.state import MAX_SPENT_GUESSES, Member, Session, Stats
from rendezvous.table import SessionTable

__all__ = ["Addr", "Limits", "Member", "Out", "RendezvousCore", "Session", "Stats"]

log = logging.getLogger("kafila.rendezvous")

Out = tuple[bytes, Addr, Addr]  # (datagram, local socket to send from, destination)
REPLY_CACHE_S = 30.0


class RendezvousCore:
    """Session registry, probe responder and relay table. No sockets, no clock: `now` comes in."""

    def __init__(self, sockets: list[Addr], limits: Limits | None = None, secret: bytes | None = None) -> None:
        if not sockets:
            raise ValueError("the rendezvous needs at least one socket")
        self.sockets = list(sockets)
        self.limits = limits or Limits()
        self.table = SessionTable(self.limits)
        self.sessions, self.by_addr = self.table.sessions, self.table.by_addr  # read by tests and the relay
        self.stats = Stats()
        self.limiter = RateLimiter(self.limits)
        self.cookies = Cookies(secret)
        self.nonces = Nonces(secret)
        # (src, request id) -> (when, digest of the request, reply): a retry is the same bytes
        self._replies: OrderedDict[tuple[Addr, int], tuple[float, bytes, bytes]] = OrderedDict()
        self._last_expiry = float("-inf")
        ips = sorted({ip for ip, _ in self.sockets})
        ports = sorted({port for _, port in self.sockets})
        self._ips, self._ports = ips, ports
        self._handlers: dict[str, Callable[[dict[str, Any], Addr, Addr, float], dict[str, Any]]] = {
            "cookie": self._op_cookie,
            "create": self._op_create,
            "join": self._op_join,
            "challenge": self._op_challenge,
            "rejoin": self._op_rejoin,
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
                return self._probe(data, src, local, now)
            if kind == "kafila":
                frame = wire.decode(data)
                if isinstance(frame, wire.Control) and frame.kind == wire.REQUEST:
                    return self._control(frame, data, src, local, now)
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

    def _probe(self, data: bytes, src: Addr, local: Addr, now: float) -> list[Out]:
        msg = stun.decode(data)
        if msg.msg_type != stun.BINDING_REQUEST:
            return []
        if not self.limiter.allow(src, now):
            self.stats.rate_limited += 1
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
        reply = stun.encode(stun.StunMessage(stun.BINDING_SUCCESS, msg.txid, mapped=src, origin=origin, other=other))
        if len(reply) > len(data):  # an unpadded request (not a member's): answering would amplify
            self.stats.dropped += 1
            return []
        return [(reply, origin, src)]

    # ---- control ---------------------------------------------------------------------------

    def _control(self, frame: wire.Control, data: bytes, src: Addr, local: Addr, now: float) -> list[Out]:
        self.stats.requests += 1
        rid, size = frame.request_id, len(data)
        if not self.limiter.allow(src, now):  # every op, retries included; never cached
            self.stats.rate_limited += 1
            refused = bounded_refusal(rid, "rate_limited", MESSAGES["rate_limited"], size)
            return [] if refused is None else [(refused, local, src)]
        key, digest = (src, rid), hashlib.sha256(data).digest()
        cached = self._replies.get(key)
        if cached is not None and now - cached[0] < REPLY_CACHE_S and cached[1] == digest:
            # only for the very same request: a small one reusing the id must not fetch a large reply
            return [(cached[2], local, src)]
        op = frame.body.get("op")
        handler = self._handlers.get(op) if isinstance(op, str) else None
        reply: bytes | None
        try:
            if handler is None:
                raise ProtocolError("unknown op")  # never the op itself: no echo
            reply = wire.encode_control(wire.RESPONSE, rid, {"ok": True, **handler(frame.body, src, local, now)})
        except CookieNeeded as exc:
            reply = wire.encode_control(wire.RESPONSE, rid, {"ok": False, "code": "cookie", "cookie": exc.cookie})
            if len(reply) > size:  # a request too small to answer without amplifying: never a legitimate one
                return []
            return [(reply, local, src)]  # not cached: it is stateless, and the next try carries the cookie
        except ProtocolError as exc:
            reply = bounded_refusal(rid, "bad_request", str(exc), size)
        except RendezvousError as exc:
            reply = bounded_refusal(rid, exc.code, str(exc), size)
        if reply is None:
            return []
        self._replies[key] = (now, digest, reply)
        self._replies.move_to_end(key)
        while len(self._replies) > self.limits.max_cached_replies:
            self._replies.popitem(last=False)
        return [(reply, local, src)]

    def _routable(self, body: dict[str, Any], src: Addr, now: float) -> bytes:
        """The cookie a source echoed, when valid for it; else CookieNeeded carries one to echo."""
        if body.get("cookie") is not None:
            cookie = wire.get_hex(body, "cookie", registration.COOKIE_LEN)
            if self.cookies.valid(cookie, src, now):
                return cookie
        raise CookieNeeded(self.cookies.issue(src, now).hex())

    def _admit_join(self, src: Addr, now: float) -> None:
        if not self.limiter.allow_join(src, now):
            self.stats.rate_limited += 1
            raise RendezvousBusy(MESSAGES["rate_limited"])

    def _session(self, body: dict[str, Any]) -> Session:
        sid = wire.get_str(body, "session", SESSION_ID_LEN)
        s = self.sessions.get(sid)
        if s is None:
            raise UnknownSession(MESSAGES["unknown_session"])
        return s

    def _registered(self, body: dict[str, Any]) -> tuple[Session, Member]:
        s = self._session(body)
        m = s.members.get(wire.get_hex(body, "member", wire.ID_LEN))
        if m is None:
            raise NotMember(MESSAGES["not_member"])
        return s, m

    def _member(self, body: dict[str, Any], src: Addr) -> tuple[Session, Member]:
        """The member whose op this is: from its registered address, MAC'd with its key, its counter unused."""
        s, m = self._registered(body)
        if m.addr != src:
            raise NotMember("member registered from another address; re-join")
        n = wire.get_int(body, "n", 1, 2**53)
        mac = wire.get_hex(body, "mac", registration.MAC_LEN)
        if not (hmac.compare_digest(registration.op_mac(m.reg_key, body), mac) and m.take(n, registration.OP_WINDOW)):
            raise RejoinRefused("the op's MAC does not verify, or its counter was used", "bad_mac")
        return s, m

    def _op_cookie(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        if len(wire.get_str(body, "pad", 2 * registration.COOKIE_PAD)) < registration.COOKIE_PAD:
            raise ProtocolError("a cookie request must be padded")  # else its answer would be the larger
        return {"cookie": self.cookies.issue(src, now).hex()}

    def _op_create(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        join_pub = wire.get_hex(body, "join_pub", registration.PUBLIC_LEN)
        self._routable(body, src, now)
        self._admit_join(src, now)
        asked = body.get("session")
        if asked is not None and not (isinstance(asked, str) and valid_session_id(asked)):
            raise ProtocolError("field 'session' must be a session id")
        if asked is not None and (known := self.sessions.get(asked)) is not None:
            if not hmac.compare_digest(known.join_pub, join_pub):  # not that session's code
                raise WrongJoinCode(MESSAGES["wrong_code"])
            return {"session": asked}  # another member of the forgotten session re-created it first
        sid = self.table.add(join_pub, src[0], now, asked).session_id
        log.info("session %s %s from %s:%d", sid, "created again" if asked else "created", *src)
        return {"session": sid}

    def _op_join(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        cookie = self._routable(body, src, now)
        self._admit_join(src, now)  # first: guessing session ids or codes costs join tokens
        s = self._session(body)
        mid = wire.get_hex(body, "member", wire.ID_LEN)
        proof = wire.get_hex(body, "proof", registration.PROOF_LEN)
        if not registration.proof_ok(s.join_pub, s.session_id, mid, cookie, proof):
            raise WrongJoinCode(MESSAGES["wrong_code"])
        if mid in s.members:  # a member id once registered is moved only by its key (rejoin)
            raise MemberExists(MESSAGES["member_exists"])
        if len(s.members) >= self.limits.max_members:
            raise RendezvousBusy(f"session is full ({self.limits.max_members} members)", "full")
        m = Member(mid, src, local, now, reg_key=registration.new_reg_key())
        self.table.joined(s, m, src, local, now)
        log.info("session %s: member %s joined from %s:%d", s.session_id, mid.hex()[:8], *src)
        return {"members": len(s.members), "reg": m.reg_key.hex()}

    def _op_challenge(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._registered(body)  # from any address: the member's NAT may have rebound
        # nothing kept: the nonce is good only for a re-join from this address (a spoofed challenge spoils none)
        return {"nonce": self.nonces.issue(s.session_id, m.member_id, src, now).hex()}

    def _op_rejoin(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._registered(body)
        self._routable(body, src, now)  # the relay address moves here: it must read what it is sent
        nonce = wire.get_hex(body, "nonce", registration.NONCE_LEN)
        mac = wire.get_hex(body, "mac", registration.MAC_LEN)
        m.spent = {n: until for n, until in m.spent.items() if until > now}  # a stale one is refused anyway
        if nonce in m.spent or not self.nonces.fresh(nonce, s.session_id, m.member_id, src, now):
            raise RejoinRefused(MESSAGES["stale_nonce"])
        verified = registration.mac_ok(m.reg_key, s.session_id, m.member_id, nonce, mac)
        if verified or len(m.spent) < MAX_SPENT_GUESSES:  # single use, spent even by a wrong MAC: one guess each
            m.spent[nonce] = self.nonces.expires(nonce, now)
        if not verified:
            raise RejoinRefused(MESSAGES["bad_mac"], "bad_mac")
        self.table.place(s, m, src, local, now)
        self.stats.rejoins += 1
        return {"members": len(s.members)}

    def _op_announce(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._member(body, src)
        self.table.announce(s, m, wire.get_str(body, "ann", 1300), now)  # RendezvousBusy when it has no room
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
        m.last_seen = now
        self.table.touch(s, now)
        return {"obs": list(src)}

    def _op_leave(self, body: dict[str, Any], src: Addr, local: Addr, now: float) -> dict[str, Any]:
        s, m = self._member(body, src)
        self.table.remove(s.session_id, m.member_id)
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
        if not self.limiter.allow_relay(sender.member_id, now):
            self.stats.rate_limited += 1
            return []  # QUIC sees a loss and slows down
        self.stats.relayed += 1
        self.stats.relayed_bytes += len(frame.payload)
        return [(wire.encode_relay(wire.RELAYED, sender.member_id, frame.payload), target.local, target.addr)]

    # ---- expiry ------------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Drop silent members and idle, unjoined or too-old sessions (at most once a second)."""
        if now - self._last_expiry < 1.0:
            return
        self._last_expiry = now
        self.table.expire(now)
        for key, (t, _, _) in list(self._replies.items()):
            if now - t < REPLY_CACHE_S:
                break
            del self._replies[key]


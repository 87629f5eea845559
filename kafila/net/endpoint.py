"""PeerEndpoint: one UDP socket per member carrying probes, rendezvous control, punches, relay and QUIC.

Datagrams are told apart by their first byte (kafila.net.wire). QUIC connections are driven
sans-I/O: each one talks to a *virtual* peer address, and this endpoint decides per datagram
whether it goes straight to the peer (once a punch proved the path both ways) or through the
rendezvous relay. So an edge is usable over the relay at once and moves to the direct path
without QUIC noticing; packets from either path are handed to the same connection.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aioquic.buffer import Buffer
from aioquic.quic import events
from aioquic.quic.packet import QuicPacketType, pull_quic_header

from kafila.errors import KafilaError, NetworkError, NotMember, ProtocolError, SessionError
from kafila.net import nat, registration, stun, wire
from kafila.net.punch import RELAY_PATH, PunchConfig, Puncher, PunchState
from kafila.net.quic import Identity, Link, LinkOwner, PinnedQuicConnection, configuration
from kafila.net.trust import Announcement, JoinCode, VerifiedMember, now_wall, open_announcement
from kafila.net.udp import UdpSocket
from kafila.planner.reachability import predict_edge

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]


@dataclass(frozen=True)
class MemberList:
    """Members whose announcements verified, and the entries refused (short id, reason)."""

    verified: tuple[VerifiedMember, ...]
    rejected: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class EdgeReport:
    """One ring edge as verified: what was predicted and what happened."""

    src: str
    dst: str
    src_class: str
    dst_class: str
    predicted: str  # "direct" | "relay"
    actual: str  # "direct" | "relay" | "failed"
    ready_ms: float | None  # connect() call -> both pins checked and a message can flow
    direct_ms: float | None  # connect() call -> direct path proven (None if it stayed relayed)
    error: str | None = None

    @property
    def unsafe(self) -> bool:
        """Predicted direct but it was not: the prediction erred on the unsafe side."""
        return self.predicted == "direct" and self.actual != "direct"


@dataclass(frozen=True)
class RingEdges:
    """This member's two ring links (None for a ring of one) and the report of its outgoing edge."""

    next: Link | None
    prev: Link | None
    report: EdgeReport | None


def _vaddr(member_id: bytes) -> Addr:
    """The address a QUIC connection is told its peer has; routing happens below it."""
    return (f"kafila-peer-{member_id.hex()}", 0)


class PeerEndpoint(LinkOwner):
    """A member's network presence: `async with PeerEndpoint(...) as ep:` (see kafila.net docs)."""

    def __init__(
        self,
        bind: Addr = ("0.0.0.0", 0),
        identity: Identity | None = None,
        name: str = "member",
        allow_direct: bool = True,
        punch: PunchConfig | None = None,
        idle_timeout_s: float = 10.0,
        keepalive_s: float = 2.0,
        rendezvous_ping_s: float = 5.0,
    ) -> None:
        self.bind, self.name = bind, name
        self.identity = identity or Identity(name)
        self.member_id = secrets.token_bytes(wire.ID_LEN)
        self.allow_direct = allow_direct
        self.punch_config = punch or PunchConfig()
        self.idle_timeout_s, self.keepalive_s, self.rendezvous_ping_s = idle_timeout_s, keepalive_s, rendezvous_ping_s
        self.nat_report: nat.NatReport | None = None
        self.code: JoinCode | None = None
        self.rendezvous: Addr | None = None
        self.peers: dict[bytes, VerifiedMember] = {}
        self.me: VerifiedMember | None = None
        self._socket: UdpSocket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._wake = asyncio.Event()
        self._ticker_at = float("inf")  # when the sleeping ticker wakes by itself
        self._stun_waiters: dict[bytes, asyncio.Future[stun.StunMessage]] = {}
        self._control_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._punchers: dict[bytes, Puncher] = {}
        self._cids: dict[bytes, PinnedQuicConnection] = {}
        self._links: dict[PinnedQuicConnection, Link] = {}
        self._accepted: asyncio.Queue[Link] = asyncio.Queue(maxsize=64)
        self._closing = False
        self._in_pump = False
        self._pump_again: set[PinnedQuicConnection] = set()
        self._last_refresh = 0.0
        self._next_ping = 0.0
        self._next_rdv_ping = 0.0
        self._reg_key: bytes | None = None  # from our first join; re-joins prove it instead of the token
        self._rejoin_task: asyncio.Task[None] | None = None
        self.local_addr: Addr = ("0.0.0.0", 0)

    # ---- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> PeerEndpoint:
        self._loop = asyncio.get_running_loop()
        try:
            self._socket = UdpSocket(self._loop, self.bind, self._on_batch)
        except OSError as exc:
            raise NetworkError(f"cannot bind UDP {self.bind[0]}:{self.bind[1]}: {exc}") from None
        self.local_addr = self._socket.local_addr
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._ticker_task = self._tg.create_task(self._ticker())
        log.info("endpoint %s on udp %s:%d", self.member_id.hex()[:8], *self.local_addr)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for link in list(self._links.values()):
            self.close_link(link, "endpoint closed")
        if self.rendezvous and self.code:
            self._send_control({"op": "leave", "session": self.code.session_id, "member": self.member_id.hex()})
        self._closing = True
        self._wake.set()
        self._ticker_task.cancel()
        if self._rejoin_task is not None:
            self._rejoin_task.cancel()
        assert self._tg is not None
        try:
            await self._tg.__aexit__(None, None, None)
        except BaseExceptionGroup as eg:  # a failed background refresh must not hide the caller's error
            log.debug("endpoint tasks ended with %s", eg)
        if self._socket is not None:
            self._socket.close()

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _sendto(self, data: bytes, addr: Addr) -> None:
        if self._socket is not None:
            self._socket.sendto(data, addr)

    # ---- demultiplexing -------------------------------------------------------------------

    def _on_batch(self, batch: list[tuple[bytes, Addr]]) -> None:
        """Feed every datagram of a wake-up to its connection first, then drive each connection once."""
        self._in_pump = True  # _pump only collects connections until the batch is in
        try:
            for data, addr in batch:
                self._on_datagram(data, addr)
        finally:
            self._in_pump = False
        if self._pump_again:
            self._pump(self._pump_again.pop())

    def _on_datagram(self, data: bytes, addr: Addr) -> None:
        try:
            kind = wire.kind_of(data)
            if kind == "stun":
                self._on_stun(data)
            elif kind == "quic":
                peer = self._peer_at(addr)
                if peer is not None:
                    self._on_quic(peer, data)
            else:
                self._on_frame(wire.decode(data), addr)
        except ProtocolError as exc:
            log.debug("dropped a malformed datagram from %s: %s", addr, exc)

    def _on_stun(self, data: bytes) -> None:
        msg = stun.decode(data)
        fut = self._stun_waiters.get(msg.txid)
        if msg.msg_type == stun.BINDING_SUCCESS and fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_frame(self, frame: wire.Frame, addr: Addr) -> None:
        if isinstance(frame, wire.Control):
            fut = self._control_waiters.get(frame.request_id)
            if frame.kind == wire.RESPONSE and addr == self.rendezvous and fut is not None and not fut.done():
                fut.set_result(frame.body)
        elif isinstance(frame, wire.Relay):
            if frame.kind != wire.RELAYED or addr != self.rendezvous:
                return
            payload = frame.payload
            if wire.kind_of(payload) == "quic":
                self._on_quic(frame.peer, payload)
            else:
                inner = wire.decode(payload)
                if isinstance(inner, wire.Punch):
                    self._on_punch(inner, RELAY_PATH)
        elif isinstance(frame, wire.Punch):
            self._on_punch(frame, addr)

    def _peer_at(self, addr: Addr) -> bytes | None:
        for pid, p in self._punchers.items():
            if p.direct == addr or addr in p.candidates:
                return pid
        return None

    def _puncher(self, member_id: bytes) -> Puncher | None:
        p = self._punchers.get(member_id)
        if p is None:
            peer = self.peers.get(member_id)
            if peer is None or self.code is None:
                self._schedule_refresh()
                return None
            cands = [a for a in (peer.mapped, peer.local, peer.observed) if a is not None]
            p = Puncher(self.member_id, member_id, self.code.punch_key, cands, self.punch_config)
            self._punchers[member_id] = p
        return p

    def _on_punch(self, frame: wire.Punch, addr: Addr) -> None:
        if not self.allow_direct or frame.receiver != self.member_id:
            return
        p = self._puncher(frame.sender)
        if p is None or not p.valid(frame):
            return
        before = p.state
        self._send_punch(p.on_frame(frame, addr, self._now()))
        if p.state != before:
            log.info("path to %s: %s -> %s %s", frame.sender.hex()[:8], before.value, p.state.value, p.direct or "")
        self._wake.set()

    def _send_punch(self, out: list[tuple[bytes, Addr]]) -> None:
        for data, dst in out:
            if dst == RELAY_PATH:
                self._relay_to(data, self._punch_peer(data))
            else:
                self._sendto(data, dst)

    @staticmethod
    def _punch_peer(data: bytes) -> bytes:
        return data[1 + wire.ID_LEN : 1 + 2 * wire.ID_LEN]

    def _relay_to(self, payload: bytes, peer: bytes) -> None:
        if self.rendezvous is not None:
            self._sendto(wire.encode_relay(wire.RELAY, peer, payload), self.rendezvous)

    def path_to(self, member_id: bytes) -> str:
        """'direct' when packets to this member go straight to it, else 'relay'."""
        p = self._punchers.get(member_id)
        return "direct" if self.allow_direct and p is not None and p.state == PunchState.DIRECT else "relay"

    def _send_to_peer(self, member_id: bytes, data: bytes) -> None:
        p = self._punchers.get(member_id)
        if self.allow_direct and p is not None and p.state == PunchState.DIRECT and p.direct is not None:
            self._sendto(data, p.direct)
        else:
            self._relay_to(data, member_id)

    # ---- QUIC -------------------------------------------------------------------------------

    def _on_quic(self, member_id: bytes, data: bytes) -> None:
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=8)
        except ValueError:
            return
        conn = self._cids.get(header.destination_cid)
        if conn is None:
            if header.packet_type != QuicPacketType.INITIAL or len(data) < 1200:
                return
            peer = self.peers.get(member_id)
            if peer is None or self.code is None:
                self._schedule_refresh()  # a member we have not listed yet: its Initial will be resent
                return
            conn = PinnedQuicConnection(
                peer=peer,
                configuration=configuration(self.identity, False, self.idle_timeout_s),
                original_destination_connection_id=header.destination_cid,
            )
            self._cids[header.destination_cid] = conn
            self._cids[conn.host_cid] = conn
            self._links[conn] = Link(self, conn)
            if self.allow_direct:  # the caller punches; punch back so the edge can go direct
                p = self._puncher(member_id)
                if p is not None:
                    p.start(self._now())
        elif conn.peer.member_id != member_id:
            return  # a connection id belonging to another peer: never cross edges
        conn.receive_datagram(data, _vaddr(member_id), self._now())
        self._pump(conn)

    def flush(self, link: Link) -> None:
        """Send whatever the link's connection has queued."""
        self._pump(link.conn)

    def _pump(self, conn: PinnedQuicConnection) -> None:
        if self._in_pump:
            self._pump_again.add(conn)
            return
        self._in_pump = True
        try:
            todo = {conn, *self._pump_again}
            self._pump_again.clear()
            while todo:
                c = todo.pop()
                self._drain(c)
                t = c.get_timer()
                if t is not None and t < self._ticker_at:
                    self._wake.set()  # the ticker sleeps past this connection's next timer
                todo |= self._pump_again
                self._pump_again.clear()
        finally:
            self._in_pump = False

    def _drain(self, conn: PinnedQuicConnection) -> None:
        """Handle a connection's events and send all it has queued."""
        link = self._links.get(conn)
        self._take_events(conn, link)
        for data, _addr in conn.datagrams_to_send(self._now()):
            self._send_to_peer(conn.peer.member_id, data)
        self._take_events(conn, link)  # sending can end the connection (a close that went out)

    def _take_events(self, conn: PinnedQuicConnection, link: Link | None) -> None:
        ev = conn.next_event()
        while ev is not None:
            if isinstance(ev, events.ConnectionIdIssued):
                self._cids[ev.connection_id] = conn
            elif isinstance(ev, events.ConnectionIdRetired):
                self._cids.pop(ev.connection_id, None)
            elif link is not None and isinstance(ev, events.HandshakeCompleted):
                link.on_handshake()
            elif link is not None and isinstance(ev, events.StreamDataReceived) and ev.stream_id == 0:
                link.on_stream_data(ev.data)
            elif isinstance(ev, events.ConnectionTerminated):
                reason = ev.reason_phrase or f"QUIC error {ev.error_code}"
                if link is not None:
                    link.on_terminated(reason if link.closed is None else link.closed)
                self._forget(conn)
            ev = conn.next_event()

    def _forget(self, conn: PinnedQuicConnection) -> None:
        for cid in [c for c, v in self._cids.items() if v is conn]:
            del self._cids[cid]
        self._links.pop(conn, None)

    def close_link(self, link: Link, reason: str) -> None:
        """Close a link's connection, telling the peer why."""
        if link.closed is None:
            link.closed = reason
            log.info("link to %s closed: %s", link.peer.short_id, reason)
        link.conn.close(error_code=0x100, reason_phrase=reason[:200])
        self._pump(link.conn)
        link.on_terminated(reason)

    def link_ready(self, link: Link) -> None:
        """A peer's incoming link passed the handshake: hand it to accept()."""
        if not link.is_client:
            try:
                self._accepted.put_nowait(link)
            except asyncio.QueueFull:
                self.close_link(link, "too many unaccepted links")

    # ---- timers ------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        """The one timer loop: QUIC timers, punch schedules, keepalives. Sleeps until the next is due."""
        while not self._closing:
            now = self._now()
            wake = now + 0.5
            for conn in list(self._links):
                t = conn.get_timer()
                if t is not None and t <= now:
                    conn.handle_timer(now)
                    self._pump(conn)
                    t = conn.get_timer()
                if t is not None:
                    wake = min(wake, t)
            if now >= self._next_ping:
                self._next_ping = now + self.keepalive_s
                for conn, link in list(self._links.items()):
                    if link.ready.is_set():
                        conn.send_ping(0)  # keeps the NAT mapping and the QUIC idle timer alive
                        self._pump(conn)
            for p in list(self._punchers.values()):
                before = p.state
                self._send_punch(p.poll(now))
                if p.state != before:
                    log.info("path to %s: %s -> %s", p.peer.hex()[:8], before.value, p.state.value)
                w = p.next_wakeup()
                if w is not None:
                    wake = min(wake, w)
            if now >= self._next_rdv_ping and self.code is not None and self.rendezvous is not None:
                self._next_rdv_ping = now + self.rendezvous_ping_s
                # a re-join, not a bare ping: if our NAT rebinds, the rendezvous learns the new address
                self._start_rejoin()
            self._wake.clear()
            if self._closing:
                return
            self._ticker_at = wake
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                async with asyncio.timeout(max(0.001, wake - self._now())):
                    await self._wake.wait()
            except TimeoutError:
                pass

    # ---- requests to the rendezvous -----------------------------------------------------

    async def _stun_request(self, dst: Addr, change: int, timeout_s: float, tries: int) -> stun.StunMessage | None:
        txid = secrets.token_bytes(12)
        assert self._loop is not None
        fut: asyncio.Future[stun.StunMessage] = self._loop.create_future()
        self._stun_waiters[txid] = fut
        try:
            for _ in range(tries):
                self._sendto(stun.encode(stun.StunMessage(stun.BINDING_REQUEST, txid, change=change)), dst)
                try:
                    async with asyncio.timeout(timeout_s):
                        return await asyncio.shield(fut)
                except TimeoutError:
                    continue
            return None
        finally:
            del self._stun_waiters[txid]

    def _send_control(self, body: dict[str, Any]) -> None:
        if self.rendezvous is not None:
            self._sendto(wire.encode_control(wire.REQUEST, secrets.randbits(32), body), self.rendezvous)

    async def _request(self, body: dict[str, Any], timeout_s: float = 0.5, tries: int = 6) -> dict[str, Any]:
        if self.rendezvous is None:
            raise SessionError("no rendezvous set: create or join a session first")
        rid = secrets.randbits(32)
        assert self._loop is not None
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._control_waiters[rid] = fut
        data = wire.encode_control(wire.REQUEST, rid, body)
        try:
            for _ in range(tries):
                self._sendto(data, self.rendezvous)
                try:
                    async with asyncio.timeout(timeout_s):
                        reply = await asyncio.shield(fut)
                    break
                except TimeoutError:
                    continue
            else:
                raise NetworkError(
                    f"rendezvous {self.rendezvous[0]}:{self.rendezvous[1]} did not answer {body.get('op')!r} "
                    f"({tries} tries in {tries * timeout_s:.1f} s)"
                )
        finally:
            del self._control_waiters[rid]
        if reply.get("ok") is not True:
            raise registration.refusal(body.get("op"), reply)  # a SessionError subclass chosen by its code
        return reply

    # ---- public API: probing and sessions ------------------------------------------------------

    async def probe_nat(self, rendezvous: Addr, timeout_s: float = 0.3, tries: int = 2) -> nat.NatReport:
        """Classify this member's NAT against the rendezvous (also sets it as our rendezvous)."""
        self.rendezvous = rendezvous
        self.nat_report = await nat.probe(self._stun_request, rendezvous, timeout_s, tries)
        log.info("NAT %s", self.nat_report.summary())
        return self.nat_report

    async def create_session(self, rendezvous: Addr, secret: str | None = None) -> JoinCode:
        """Ask the rendezvous for a new session (we make the secret; it never sees it), and join it."""
        self.rendezvous = rendezvous
        secret = secret or JoinCode.new_secret()
        provisional = JoinCode.parse("00000000" + secret)  # checks the secret's form
        reply = await self._request({"op": "create", "token_hash": provisional.join_token_hash.hex()})
        sid = wire.get_str(reply, "session", 8)
        code = JoinCode(sid, secret)
        await self.join_session(rendezvous, code)
        return code

    async def join_session(self, rendezvous: Addr, code: JoinCode | str) -> None:
        """Join with a code; WrongJoinCode / UnknownSession (SessionErrors) when the rendezvous refuses it."""
        self.rendezvous = rendezvous
        code = JoinCode.parse(code) if isinstance(code, str) else code
        reply = await self._request(registration.join_body(code.session_id, self.member_id, code.join_token))
        self._reg_key = registration.reg_key_of(reply)  # the token goes out in clear this once only
        self.code = code
        self._next_rdv_ping = self._now() + self.rendezvous_ping_s

    def _start_rejoin(self) -> None:
        """Re-join in the background, one at a time (two would spend each other's nonces)."""
        if self._tg is None or self.code is None or self._reg_key is None:
            return
        if self._rejoin_task is None or self._rejoin_task.done():
            self._rejoin_task = self._tg.create_task(self._rejoin(self.code, self._reg_key))

    async def _rejoin(self, code: JoinCode, reg_key: bytes) -> None:
        try:
            try:
                await registration.rejoin(self._request, code.session_id, self.member_id, reg_key)
            except NotMember:  # forgotten (silent past the rendezvous's timeout): register afresh
                reply = await self._request(registration.join_body(code.session_id, self.member_id, code.join_token))
                self._reg_key = registration.reg_key_of(reply)
        except KafilaError as exc:
            log.info("re-join with the rendezvous failed: %s", exc)

    def _local_candidate(self) -> Addr | None:
        ip = self.local_addr[0]
        if ip == "0.0.0.0" and self.rendezvous is not None:
            try:  # which of our addresses routes toward the rendezvous (no packet is sent)
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.connect(self.rendezvous)
                    ip = s.getsockname()[0]
            except OSError:
                return None
        return (ip, self.local_addr[1])

    async def announce(self, measurements: dict[str, Any] | None = None) -> VerifiedMember:
        """Publish our MAC'd announcement (fingerprint, addresses, NAT class, measurements)."""
        if self.code is None:
            raise SessionError("join a session before announcing")
        if self.nat_report is None:
            raise SessionError("probe the NAT (probe_nat) before announcing")
        ann = Announcement(
            session_id=self.code.session_id,
            member_id=self.member_id,
            name=self.name,
            fingerprint=self.identity.fingerprint,
            nat_class=self.nat_report.nat_class.value,
            mapped=self.nat_report.mapped,
            local=self._local_candidate(),
            rtt_ms=self.nat_report.rtt_ms,
            measurements=measurements or {},
            issued_at=now_wall(),
        )
        sealed = ann.seal(self.code)
        await self._request(
            {"op": "announce", "session": self.code.session_id, "member": self.member_id.hex(), "ann": sealed}
        )
        self.me = open_announcement(sealed, self.code, self.member_id)
        return self.me

    async def members(self) -> MemberList:
        """Every listed member whose announcement verifies under our join code; the others, refused."""
        if self.code is None:
            raise SessionError("join a session first")
        verified: list[VerifiedMember] = []
        rejected: list[tuple[str, str]] = []
        start, total = 0, 1
        for _ in range(64):  # bounded paging
            if start >= total:
                break
            reply = await self._request(
                {"op": "list", "session": self.code.session_id, "member": self.member_id.hex(), "start": start}
            )
            total = wire.get_int(reply, "total", 0, 1024)
            page = reply.get("members")
            if not isinstance(page, list) or not page:
                break
            for entry in page:
                try:
                    if not isinstance(entry, dict):
                        raise ProtocolError("member entry is not an object")
                    mid = wire.get_hex(entry, "id", wire.ID_LEN)
                    obs = wire.get_addr(entry.get("obs"), "obs")
                    verified.append(open_announcement(wire.get_str(entry, "ann", 1300), self.code, mid, obs))
                except (ProtocolError, SessionError) as exc:
                    raw_id = entry.get("id") if isinstance(entry, dict) else None
                    short = raw_id[:8] if isinstance(raw_id, str) else "?"
                    log.warning("refused member %s: %s", short, exc)
                    rejected.append((short, str(exc)))
            start += len(page)
        ids = [v.member_id for v in verified]
        if len(set(ids)) != len(ids):
            raise SessionError("the rendezvous listed one member twice: refusing the list")
        for v in verified:
            old = self.peers.get(v.member_id)
            if old is not None and old.fingerprint != v.fingerprint:
                raise SessionError(f"member {v.short_id} changed its certificate fingerprint mid-session: refused")
            self.peers[v.member_id] = v
        return MemberList(tuple(verified), tuple(rejected))

    async def wait_for_members(self, n: int, timeout_s: float = 30.0, poll_s: float = 0.2) -> MemberList:
        """Poll the member list until at least n members verify; NetworkError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            ml = await self.members()
            if len(ml.verified) >= n:
                return ml
            if time.monotonic() > deadline:
                raise NetworkError(f"only {len(ml.verified)} of {n} members joined within {timeout_s:.0f} s")
            await asyncio.sleep(poll_s)

    def _schedule_refresh(self) -> None:
        now = time.monotonic()
        if self._tg is None or self.code is None or now - self._last_refresh < 0.3:
            return
        self._last_refresh = now
        self._tg.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.members()
        except KafilaError as exc:
            log.info("member refresh failed: %s", exc)

    # ---- public API: links ---------------------------------------------------------------

    async def connect(self, peer: VerifiedMember, timeout_s: float = 10.0) -> Link:
        """Open a pinned QUIC link to a verified member: relayed at once, direct when a punch succeeds."""
        if self.code is None or peer.member_id not in self.peers:
            raise SessionError(f"{peer.short_id} is not a verified member of this session")
        if peer.member_id == self.member_id:
            raise SessionError("cannot connect to ourselves")
        t0 = self._now()
        if self.allow_direct:
            p = self._puncher(peer.member_id)
            if p is not None:
                p.start(t0)
        conn = PinnedQuicConnection(peer=peer, configuration=configuration(self.identity, True, self.idle_timeout_s))
        conn.connect(_vaddr(peer.member_id), t0)
        self._cids[conn.host_cid] = conn
        link = Link(self, conn, ready_timeout_s=timeout_s)
        link.opened_at = t0
        self._links[conn] = link
        self._pump(conn)
        await link.wait_ready()
        link.ready_at = self._now()
        log.info("link to %s ready in %.1f ms via %s", peer.short_id, (link.ready_at - t0) * 1000, link.path)
        return link

    async def accept(self, timeout_s: float = 30.0) -> Link:
        """The next incoming link (pins checked both ways); TimeoutError after timeout_s."""
        async with asyncio.timeout(timeout_s):
            return await self._accepted.get()

    async def settle_path(self, peer: VerifiedMember, timeout_s: float | None = None) -> str:
        """Wait (bounded) until punching toward peer has an outcome; 'direct' or 'relay'."""
        p = self._punchers.get(peer.member_id)
        if not self.allow_direct or p is None:
            return "relay"
        limit = timeout_s if timeout_s is not None else self.punch_config.window_s + 0.5
        deadline = self._now() + limit
        while not p.settled and p.state != PunchState.IDLE and self._now() < deadline:
            await asyncio.sleep(0.02)
        return self.path_to(peer.member_id)

    async def verify_edge(self, peer: VerifiedMember, timeout_s: float = 10.0) -> tuple[Link | None, EdgeReport]:
        """Connect to peer and record predicted vs actual path and the time to a usable link."""
        me = self.me
        if me is None:
            raise SessionError("announce before verifying edges")
        predicted = predict_edge(me.nat_class, peer.nat_class)
        t0 = self._now()
        try:
            link = await self.connect(peer, timeout_s)
        except (NetworkError, SessionError) as exc:
            rep = EdgeReport(me.short_id, peer.short_id, me.nat_class.value, peer.nat_class.value, predicted,
                             "failed", None, None, str(exc))
            return None, rep
        ready_ms = ((link.ready_at or t0) - t0) * 1000.0
        actual = await self.settle_path(peer)
        p = self._punchers.get(peer.member_id)
        direct_ms = (p.direct_at - t0) * 1000.0 if actual == "direct" and p and p.direct_at else None
        rep = EdgeReport(me.short_id, peer.short_id, me.nat_class.value, peer.nat_class.value, predicted, actual,
                         round(ready_ms, 2), None if direct_ms is None else round(max(direct_ms, 0.0), 2))
        log.info("edge %s -> %s: predicted %s, actual %s, ready %.1f ms", rep.src, rep.dst, predicted, actual, ready_ms)
        return link, rep

    async def open_ring(self, order: Sequence[VerifiedMember], timeout_s: float = 15.0) -> RingEdges:
        """Open exactly this member's two ring edges: connect to the successor, accept the predecessor."""
        if self.me is None:
            raise SessionError("announce before opening the ring")
        ids = [m.member_id for m in order]
        if self.member_id not in ids:
            raise SessionError("this member is not in the ring order")
        if len(order) == 1:
            return RingEdges(None, None, None)
        i = ids.index(self.member_id)
        succ, pred = order[(i + 1) % len(order)], order[(i - 1) % len(order)]

        async def from_pred() -> Link:
            deadline = self._now() + timeout_s
            stray: list[Link] = []
            try:
                while True:
                    link = await self.accept(max(0.01, deadline - self._now()))
                    if link.peer.member_id == pred.member_id:
                        return link
                    stray.append(link)
            finally:
                for s in stray:  # links for someone else's purpose go back in the queue
                    self._accepted.put_nowait(s)

        try:
            async with asyncio.TaskGroup() as tg:
                out_task = tg.create_task(self.verify_edge(succ, timeout_s))
                in_task = tg.create_task(from_pred())
        except* TimeoutError:
            msg = f"predecessor {pred.name} ({pred.short_id}) did not connect within {timeout_s:.0f} s"
            raise NetworkError(msg)  # noqa: B904 (the group's traceback adds nothing for a person)
        nxt, report = out_task.result()
        return RingEdges(nxt, in_task.result(), report)

"""EndpointCore: a member's datagram protocol state, sans-I/O (no socket, no clock, no asyncio).

Like aioquic's QuicConnection, the caller feeds it `receive_datagram(data, addr, now)`, sends
what `datagrams_to_send(now)` returns, wakes it at `get_timer()` with `handle_timer(now)` and
reads what happened from `next_event()`. One core carries, on one socket, STUN answers and
rendezvous replies (handed out as events), punch frames (kafila.net.punch), relay envelopes and
QUIC. Datagrams are told apart by their first byte (kafila.net.wire).

Each QUIC connection talks to a *virtual* peer address; the core decides per datagram whether
it goes straight to the peer (once a punch proved the path both ways) or through the
rendezvous relay, so an edge is usable over the relay at once and moves to the direct path
without QUIC noticing; packets from either path reach the same connection.

Limits against a flood of Initials (issue #13 item 5): an Initial creates a connection only
when it comes from a listed peer, that peer has fewer than `max_pending_per_peer` connections
still in their handshake (each ends by QUIC's idle timeout if it never completes), and
something in it decrypted (a forged Initial is dropped before it counts); every connection's
ids are indexed per connection, so forgetting one costs O(its ids).
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.buffer import Buffer
from aioquic.quic import events as qe
from aioquic.quic.packet import QuicPacketType, pull_quic_header

from kafila.errors import ProtocolError, SessionError
from kafila.net import stun, wire
from kafila.net.pmtu import DEFAULT_CEILING, PmtuConfig, PmtuSearch
from kafila.net.punch import RELAY_PATH, PunchConfig, Puncher, PunchState
from kafila.net.quic import Identity, PinnedQuicConnection, configuration
from kafila.net.trust import VerifiedMember

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]
MIN_INITIAL = 1200  # RFC 9000 §14.1: a client's Initial is padded to at least this
HOST_CID_LEN = 8  # aioquic's connection ids (QuicConfiguration.connection_id_length's default)


# ---- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StunReceived:
    """A STUN Binding answer (the rendezvous client matches it to its request)."""

    msg: stun.StunMessage


@dataclass(frozen=True)
class ControlReceived:
    """A RESPONSE frame from the rendezvous."""

    request_id: int
    body: dict[str, Any]


@dataclass(frozen=True)
class ConnectionAccepted:
    """A listed peer opened a QUIC connection to us (handshake still under way)."""

    conn: PinnedQuicConnection


@dataclass(frozen=True)
class HandshakeCompleted:
    """TLS is done on a connection (its pin is not checked yet: the Link does that)."""

    conn: PinnedQuicConnection


@dataclass(frozen=True)
class StreamData:
    """Bytes on stream 0 of a connection."""

    conn: PinnedQuicConnection
    data: bytes


@dataclass(frozen=True)
class ConnectionEnded:
    """A connection is gone; the core has forgotten it."""

    conn: PinnedQuicConnection
    reason: str


@dataclass(frozen=True)
class PeerUnknown:
    """Something came from a member id we have not listed yet: refresh the member list."""

    member_id: bytes


@dataclass(frozen=True)
class PathChanged:
    """The punch state toward a peer changed (direct is the proven address when DIRECT)."""

    member_id: bytes
    before: PunchState
    after: PunchState
    direct: Addr | None


@dataclass(frozen=True)
class RejoinDue:
    """Time to re-register with the rendezvous (so it learns a rebound NAT mapping)."""


@dataclass(frozen=True)
class RendezvousLost:
    """Nothing came from the rendezvous for `silent_s`: relayed connections were closed (`reason` says why).

    Direct connections never touch the rendezvous and go on; re-joins go on too, so that the
    member re-registers as soon as it answers again.
    """

    rendezvous: Addr
    silent_s: float
    reason: str
    closed: int  # relayed connections closed with `reason`


@dataclass(frozen=True)
class RendezvousBack:
    """The rendezvous answered again after it was lost (`silent_s`: for how long it was silent)."""

    rendezvous: Addr
    silent_s: float


Event = (StunReceived | ControlReceived | ConnectionAccepted | HandshakeCompleted | StreamData | ConnectionEnded
         | PeerUnknown | PathChanged | RejoinDue | RendezvousLost | RendezvousBack)


def vaddr(member_id: bytes) -> Addr:
    """The address a QUIC connection is told its peer has; routing happens below it."""
    return (f"kafila-peer-{member_id.hex()}", 0)


@dataclass(frozen=True)
class CoreConfig:
    """Timings (seconds) and bounds of one endpoint core."""

    allow_direct: bool = True
    idle_timeout_s: float = 10.0
    keepalive_s: float = 2.0
    rejoin_s: float = 5.0
    max_pending_per_peer: int = 2
    pmtu: PmtuConfig | None = field(default_factory=PmtuConfig)  # path MTU search (None: stay at 1,200 bytes)
    # The rendezvous's health: after rendezvous_probe_s of silence from it, a STUN Binding request
    # goes to it once per rendezvous_probe_s (any answer counts); silent for lost_after_s, it is lost.
    rendezvous_probe_s: float = 1.0
    rendezvous_lost_s: float = 8.0
    # The largest UDP payload the local route toward an address carries (its interface's MTU less the IP and
    # UDP headers; None: unknown): a direct path's search ceiling. A routing lookup that sends nothing
    # (kafila.net.udp.route_payload_limit); None here searches every path up to DEFAULT_CEILING.
    route_limit: Callable[[Addr], int | None] | None = None

    @property
    def lost_after_s(self) -> float:
        """Silence that makes the rendezvous lost: below the idle timeout, so that a relayed connection
        ends with that reason rather than by QUIC's idle timeout, which says nothing of why."""
        return min(self.rendezvous_lost_s, 0.7 * self.idle_timeout_s)


class EndpointCore:
    """Demultiplexing, punching, relaying and QUIC for one member, driven by its caller."""

    def __init__(self, member_id: bytes, identity: Identity, config: CoreConfig | None = None,
                 punch: PunchConfig | None = None) -> None:
        self.member_id, self.identity = member_id, identity
        self.config = config or CoreConfig()
        self.punch_config = punch or PunchConfig()
        self.rendezvous: Addr | None = None
        self.punch_key: bytes | None = None  # set once we are in a session
        self.peers: dict[bytes, VerifiedMember] = {}  # verified members, kept by the membership layer
        self._punchers: dict[bytes, Puncher] = {}
        self._reported: dict[bytes, PunchState] = {}  # the punch state last told to the caller, per peer
        self._cids: dict[bytes, PinnedQuicConnection] = {}
        self._conn_cids: dict[PinnedQuicConnection, set[bytes]] = {}  # every connection's ids: O(own) forget
        self._pending: dict[bytes, set[PinnedQuicConnection]] = {}  # per peer: incoming, handshake not done
        self._established: set[PinnedQuicConnection] = set()
        self._pmtu: dict[PinnedQuicConnection, PmtuSearch] = {}  # established connections' path MTU searches
        self._dirty: set[PinnedQuicConnection] = set()
        self._out: list[tuple[bytes, Addr]] = []
        self._events: deque[Event] = deque()
        self._next_ping: float | None = None
        self._next_rejoin: float | None = None
        self._rdv_heard_at: float | None = None  # when something last came from the rendezvous (once joined)
        self._rdv_probed_at = float("-inf")  # when we last sent it a STUN probe to see if it lives
        self.rendezvous_lost: RendezvousLost | None = None  # while it is lost

    # ---- the caller's interface ---------------------------------------------------------

    def receive_datagram(self, data: bytes, addr: Addr, now: float) -> None:
        """Handle one datagram from the socket; malformed ones are dropped (logged at debug)."""
        if addr == self.rendezvous and self._rdv_heard_at is not None:
            self._heard_rendezvous(now)
        try:
            kind = wire.kind_of(data)
            if kind == "stun":
                msg = stun.decode(data)
                if msg.msg_type == stun.BINDING_SUCCESS:
                    self._events.append(StunReceived(msg))
            elif kind == "quic":
                peer = self._peer_at(addr)
                if peer is not None:
                    self._on_quic(peer, data, now)
            else:
                self._on_frame(wire.decode(data), addr, now)
        except ProtocolError as exc:
            log.debug("dropped a malformed datagram from %s: %s", addr, exc)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        """Everything due now: QUIC packets of every connection touched since the last call, punches, control."""
        while self._dirty:
            self._drain(self._dirty.pop(), now)
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """When handle_timer() next has something to do (None: nothing scheduled)."""
        times = [t for t in (self._next_ping, self._next_rejoin, *self._rdv_timers()) if t is not None]
        times += [t for c in self._conn_cids if (t := c.get_timer()) is not None]
        times += [t for p in self._punchers.values() if (t := p.next_wakeup()) is not None]
        times += [t for s in self._pmtu.values() if (t := s.next_wakeup()) is not None]
        return min(times, default=None)

    def handle_timer(self, now: float) -> None:
        """Run whatever is due: QUIC timers, keepalive pings, punch schedules, the rendezvous re-join."""
        for conn in list(self._conn_cids):
            t = conn.get_timer()
            if t is not None and t <= now:
                conn.handle_timer(now)
                self._dirty.add(conn)
        for conn, search in self._pmtu.items():
            t = search.next_wakeup()
            if t is not None and t <= now:
                self._dirty.add(conn)  # _drain sends the probe
        if self._next_ping is not None and now >= self._next_ping:
            self._next_ping = now + self.config.keepalive_s
            for conn in self._established:
                conn.send_ping(0)  # keeps the NAT mapping and the QUIC idle timer alive
                self._dirty.add(conn)
        for p in list(self._punchers.values()):
            self._run_puncher(p, p.poll(now), now)
        if self._next_rejoin is not None and now >= self._next_rejoin:
            self._next_rejoin = now + self.config.rejoin_s
            self._events.append(RejoinDue())
        probe_at, lost_at = self._rdv_timers()
        if lost_at is not None and now >= lost_at:
            self._lose_rendezvous(now)
        elif probe_at is not None and now >= probe_at and self.rendezvous is not None:
            self._rdv_probed_at = now
            probe = stun.StunMessage(stun.BINDING_REQUEST, secrets.token_bytes(12))
            self._out.append((stun.encode(probe), self.rendezvous))  # its answer is only "heard"

    def next_event(self) -> Event | None:
        """The oldest event not yet taken, or None."""
        return self._events.popleft() if self._events else None

    # ---- commands -----------------------------------------------------------------------

    def joined(self, rendezvous: Addr, punch_key: bytes, now: float) -> None:
        """We are registered in a session: punch with its key, re-join periodically."""
        self.rendezvous, self.punch_key = rendezvous, punch_key
        self._next_rejoin = now + self.config.rejoin_s
        self._rdv_heard_at = now  # it has just answered our join
        if self._next_ping is None:
            self._next_ping = now + self.config.keepalive_s

    def connect(self, peer: VerifiedMember, now: float) -> PinnedQuicConnection:
        """Open a QUIC connection to a verified member (relayed at once; punching starts beside it)."""
        if self.punch_key is None or peer.member_id not in self.peers:
            raise SessionError(f"{peer.short_id} is not a verified member of this session")
        if peer.member_id == self.member_id:
            raise SessionError("cannot connect to ourselves")
        self.start_punch(peer.member_id, now)
        conn = PinnedQuicConnection(peer=peer, configuration=configuration(self.identity, True,
                                                                           self.config.idle_timeout_s))
        conn.connect(vaddr(peer.member_id), now)
        self._index(conn, conn.host_cid)
        self._dirty.add(conn)
        return conn

    def send_stream(self, conn: PinnedQuicConnection, data: bytes) -> None:
        """Queue bytes on a connection's stream 0."""
        conn.send_stream_data(0, data)
        self._dirty.add(conn)

    def touch(self, conn: PinnedQuicConnection) -> None:
        """The caller changed a connection directly: include it in the next datagrams_to_send."""
        self._dirty.add(conn)

    def close(self, conn: PinnedQuicConnection, reason: str) -> None:
        """Close a connection, telling the peer why."""
        conn.close(error_code=0x100, reason_phrase=reason[:200])
        self._dirty.add(conn)

    def start_punch(self, member_id: bytes, now: float) -> None:
        """Start punching toward a peer (no-op with direct paths off or an unlisted peer)."""
        if self.config.allow_direct:
            p = self._puncher(member_id)
            if p is not None:
                p.start(now)

    def path_to(self, member_id: bytes) -> str:
        """'direct' when packets to this member go straight to it, else 'relay'."""
        p = self._punchers.get(member_id)
        return "direct" if self.config.allow_direct and p is not None and p.state == PunchState.DIRECT else "relay"

    def punch_outcome(self, member_id: bytes) -> tuple[bool, float | None]:
        """(settled, when the direct path was proven): settled once punching has an outcome or never began."""
        p = self._punchers.get(member_id)
        if not self.config.allow_direct or p is None:
            return True, None
        return p.settled or p.state == PunchState.IDLE, p.direct_at

    def mtu_search(self, conn: PinnedQuicConnection) -> PmtuSearch | None:
        """The connection's path MTU search (None before its handshake, or with the search off)."""
        return self._pmtu.get(conn)

    # ---- the rendezvous's health --------------------------------------------------------------

    def _rdv_timers(self) -> tuple[float | None, float | None]:
        """(when to probe the rendezvous next, when silence makes it lost); None, None when not joined or lost."""
        if self._rdv_heard_at is None or self.rendezvous_lost is not None:
            return None, None
        probe_at = max(self._rdv_heard_at, self._rdv_probed_at) + self.config.rendezvous_probe_s
        return probe_at, self._rdv_heard_at + self.config.lost_after_s

    def _heard_rendezvous(self, now: float) -> None:
        assert self._rdv_heard_at is not None and self.rendezvous is not None
        if self.rendezvous_lost is not None:
            silent = now - self._rdv_heard_at
            self.rendezvous_lost = None
            log.info("the rendezvous %s:%d answers again after %.0f s", *self.rendezvous, silent)
            self._events.append(RendezvousBack(self.rendezvous, silent))
        self._rdv_heard_at = now

    def _lose_rendezvous(self, now: float) -> None:
        """The rendezvous is silent: every connection it relays is dead, so end each with the reason now.

        Without this a relayed edge would end by QUIC's idle timeout, saying nothing of why.
        """
        assert self._rdv_heard_at is not None and self.rendezvous is not None
        silent = now - self._rdv_heard_at
        ip, port = self.rendezvous
        reason = f"its relay, the rendezvous at {ip}:{port}, is lost (nothing heard from it for {silent:.0f} s)"
        relayed = [c for c in self._conn_cids if self.path_to(c.peer.member_id) == "relay"]
        for conn in relayed:
            conn.close(error_code=0x100, reason_phrase=reason[:200])  # the peer never hears it: no relay
            self._forget(conn)
            self._events.append(ConnectionEnded(conn, reason))
        self.rendezvous_lost = RendezvousLost(self.rendezvous, silent, reason, len(relayed))
        log.warning("the rendezvous %s:%d is silent for %.0f s: %d relayed connection(s) closed; direct ones go on",
                    ip, port, silent, len(relayed))
        self._events.append(self.rendezvous_lost)

    @property
    def connections(self) -> list[PinnedQuicConnection]:
        """Every connection the core still drives."""
        return list(self._conn_cids)

    # ---- frames ---------------------------------------------------------------------------

    def _on_frame(self, frame: wire.Frame, addr: Addr, now: float) -> None:
        if isinstance(frame, wire.Control):
            if frame.kind == wire.RESPONSE and addr == self.rendezvous:
                self._events.append(ControlReceived(frame.request_id, frame.body))
        elif isinstance(frame, wire.Relay):
            if frame.kind != wire.RELAYED or addr != self.rendezvous:
                return
            payload = frame.payload
            if wire.kind_of(payload) == "quic":
                self._on_quic(frame.peer, payload, now)
            else:
                inner = wire.decode(payload)
                if isinstance(inner, wire.Punch):
                    self._on_punch(inner, RELAY_PATH, now)
        elif isinstance(frame, wire.Punch):
            self._on_punch(frame, addr, now)

    def _peer_at(self, addr: Addr) -> bytes | None:
        for pid, p in self._punchers.items():
            if p.direct == addr or addr in p.candidates:
                return pid
        return None

    def _puncher(self, member_id: bytes) -> Puncher | None:
        p = self._punchers.get(member_id)
        if p is None:
            peer = self.peers.get(member_id)
            if peer is None or self.punch_key is None:
                self._events.append(PeerUnknown(member_id))
                return None
            cands = [a for a in (peer.mapped, peer.local, peer.observed) if a is not None]
            p = Puncher(self.member_id, member_id, self.punch_key, cands, self.punch_config)
            self._punchers[member_id] = p
        return p

    def _on_punch(self, frame: wire.Punch, addr: Addr, now: float) -> None:
        if not self.config.allow_direct or frame.receiver != self.member_id:
            return
        p = self._puncher(frame.sender)
        if p is not None:  # the puncher checks the MAC and the frame's freshness
            self._run_puncher(p, p.on_frame(frame, addr, now), now)

    def _run_puncher(self, p: Puncher, out: list[tuple[bytes, Addr]], now: float) -> None:
        """Route a puncher's datagrams and report a change of its state."""
        for data, dst in out:
            if dst == RELAY_PATH:
                self._relay_to(data, p.peer)
            else:
                self._out.append((data, dst))
        before = self._reported.get(p.peer, PunchState.IDLE)
        if p.state != before:
            self._reported[p.peer] = p.state
            log.info("path to %s: %s -> %s %s", p.peer.hex()[:8], before.value, p.state.value, p.direct or "")
            self._events.append(PathChanged(p.peer, before, p.state, p.direct))
            if PunchState.DIRECT in (before, p.state):  # packets take another path: its size is unknown
                for conn, search in self._pmtu.items():
                    if conn.peer.member_id == p.peer:
                        search.start(now, self._ceiling(p.peer))
                        conn.set_datagram_size(search.size)
                        self._dirty.add(conn)

    def _relay_to(self, payload: bytes, peer: bytes) -> None:
        if self.rendezvous is None:
            return
        if 1 + wire.ID_LEN + len(payload) > wire.MAX_DATAGRAM:
            # built for a direct path that has just gone: the relay's frames cannot carry it, as a
            # path drops what it cannot carry (QUIC sends its data again at the relay's size)
            log.debug("a %d-byte datagram does not fit the relay's envelope: dropped", len(payload))
            return
        self._out.append((wire.encode_relay(wire.RELAY, peer, payload), self.rendezvous))

    def _ceiling(self, member_id: bytes) -> int:
        """The largest datagram worth probing toward a peer: its direct route's, or the relay's envelope."""
        p = self._punchers.get(member_id)
        if self.path_to(member_id) != "direct" or p is None or p.direct is None or self.config.route_limit is None:
            return DEFAULT_CEILING  # with the relay's 9-byte envelope still within wire.MAX_DATAGRAM
        return self.config.route_limit(p.direct) or DEFAULT_CEILING

    def _send_to_peer(self, member_id: bytes, data: bytes) -> None:
        p = self._punchers.get(member_id)
        if self.config.allow_direct and p is not None and p.state == PunchState.DIRECT and p.direct is not None:
            self._out.append((data, p.direct))
        else:
            self._relay_to(data, member_id)

    # ---- QUIC -----------------------------------------------------------------------------

    def _on_quic(self, member_id: bytes, data: bytes, now: float) -> None:
        if not data[0] & 0x80:  # a short header (nearly every packet): its destination id is the next 8 bytes
            conn = self._cids.get(data[1:1 + HOST_CID_LEN])
            if conn is None:
                return
        else:
            try:
                header = pull_quic_header(Buffer(data=data), host_cid_length=HOST_CID_LEN)
            except ValueError:
                return
            conn = self._cids.get(header.destination_cid)
            if conn is None:
                if header.packet_type == QuicPacketType.INITIAL and len(data) >= MIN_INITIAL:
                    self._accept(member_id, header.destination_cid, data, now)
                return
        if conn.peer.member_id != member_id:
            return  # a connection id belonging to another peer: never cross edges
        conn.receive_datagram(data, vaddr(member_id), now)
        self._take_events(conn)
        self._dirty.add(conn)

    def _accept(self, member_id: bytes, dcid: bytes, data: bytes, now: float) -> None:
        """A connection for a new Initial: only from a listed peer, within its bound of pending handshakes."""
        peer = self.peers.get(member_id)
        if peer is None or self.punch_key is None:
            self._events.append(PeerUnknown(member_id))  # a member not listed yet: its Initial will be resent
            return
        pending = self._pending.setdefault(member_id, set())
        if len(pending) >= self.config.max_pending_per_peer:
            log.debug("Initial from %s dropped: %d handshakes already pending", peer.short_id, len(pending))
            return
        conn = PinnedQuicConnection(
            peer=peer,
            configuration=configuration(self.identity, False, self.config.idle_timeout_s),
            original_destination_connection_id=dcid,
        )
        conn.receive_datagram(data, vaddr(member_id), now)
        out = conn.datagrams_to_send(now)
        if not out:
            return  # nothing in it decrypted (forged or corrupt): the connection is dropped before it counts
        self._index(conn, dcid)
        self._index(conn, conn.host_cid)
        pending.add(conn)
        self._events.append(ConnectionAccepted(conn))
        self._take_events(conn)
        for packet, _addr in out:
            self._send_to_peer(member_id, packet)
        self._dirty.add(conn)
        self.start_punch(member_id, now)  # the caller punches; punch back so the edge can go direct

    def _index(self, conn: PinnedQuicConnection, cid: bytes) -> None:
        self._cids[cid] = conn
        self._conn_cids.setdefault(conn, set()).add(cid)

    def _drain(self, conn: PinnedQuicConnection, now: float) -> None:
        """Send all a connection has queued and take its events."""
        if conn not in self._conn_cids:
            return  # already forgotten
        self._take_events(conn)
        search = self._path_mtu(conn, now)
        for data, _addr in conn.datagrams_to_send(now):
            self._send_to_peer(conn.peer.member_id, data)
        if search is not None and (size := search.probe_due(now)) is not None:
            probe = conn.mtu_probe(size, search.generation, now)
            if probe is not None:
                self._send_to_peer(conn.peer.member_id, probe)
            else:  # could not be built: counts as a failed try, so the search never waits on it forever
                search.on_lost(size, search.generation, now)
        self._take_events(conn)  # sending can end the connection (a close that went out)

    def _path_mtu(self, conn: PinnedQuicConnection, now: float) -> PmtuSearch | None:
        """The connection's path MTU search, fed what its probes and loss timer told; the size applied."""
        if self.config.pmtu is None or conn not in self._established:
            return None
        search = self._pmtu.get(conn)
        if search is None:
            search = self._pmtu[conn] = PmtuSearch(self.config.pmtu)
            search.start(now, self._ceiling(conn.peer.member_id))
        for size, generation, acked in conn.mtu_outcomes:
            if acked:
                search.on_acked(size, generation, now)
            else:
                search.on_lost(size, generation, now)
        conn.mtu_outcomes.clear()
        if search.raised and conn._loss._pto_count >= search.config.black_hole_ptos:  # aioquic internal, 1.7.2
            log.info("path to %s no longer carries %d-byte datagrams: back to %d", conn.peer.short_id,
                     search.size, search.config.base)
            search.on_black_hole(now)
        if conn.datagram_size != search.size:
            log.debug("datagrams to %s: %d -> %d bytes", conn.peer.short_id, conn.datagram_size, search.size)
            conn.set_datagram_size(search.size)
        return search

    def _take_events(self, conn: PinnedQuicConnection) -> None:
        ev = conn.next_event()
        while ev is not None:
            if isinstance(ev, qe.ConnectionIdIssued):
                if conn in self._conn_cids:
                    self._index(conn, ev.connection_id)
            elif isinstance(ev, qe.ConnectionIdRetired):
                self._cids.pop(ev.connection_id, None)
                self._conn_cids.get(conn, set()).discard(ev.connection_id)
            elif isinstance(ev, qe.HandshakeCompleted):
                self._pending.get(conn.peer.member_id, set()).discard(conn)
                self._established.add(conn)
                self._events.append(HandshakeCompleted(conn))
            elif isinstance(ev, qe.StreamDataReceived) and ev.stream_id == 0:
                self._events.append(StreamData(conn, ev.data))
            elif isinstance(ev, qe.ConnectionTerminated):
                self._forget(conn)
                self._events.append(ConnectionEnded(conn, ev.reason_phrase or f"QUIC error {ev.error_code}"))
            ev = conn.next_event()

    def _forget(self, conn: PinnedQuicConnection) -> None:
        for cid in self._conn_cids.pop(conn, set()):
            if self._cids.get(cid) is conn:
                del self._cids[cid]
        self._pending.get(conn.peer.member_id, set()).discard(conn)
        self._established.discard(conn)
        self._pmtu.pop(conn, None)
        self._dirty.discard(conn)

"""EndpointCore: a member's datagram protocol state, sans-I/O (no socket, no clock, no asyncio).

Like aioquic's QuicConnection, the caller feeds it `receive_datagram(data, addr, now)`, sends
what `datagrams_to_send(now)` returns, wakes it at `get_timer()` with `handle_timer(now)` and
reads what happened from `next_event()`. One core carries, on one socket, STUN answers and
rendezvous replies (handed out as events), punch frames (kafila.net.punch), relay envelopes and
QUIC. Datagrams are told apart by their first byte (kafila.net.wire). Its parts: the events it
hands out (kafila.net.events), its QUIC connections' bookkeeping (kafila.net.connections) and the
rendezvous's health (kafila.net.rdvhealth).

Each QUIC connection talks to a *virtual* peer address; the core decides per datagram whether it goes
straight to the peer (once a punch, MAC'd with the pair's own key, proved the path both ways and a
connection validated it: kafila.net.directpath) or through the rendezvous relay, so an edge is usable
over the relay at once and moves to the direct path without QUIC noticing.

Limits against a flood of Initials (issue #13 item 5, issue #34 item 8): an Initial creates a
connection only when it comes from a listed peer and carries the token of a Retry this core sent
that peer along its path (kafila.net.retry: a forger that cannot receive there takes nothing),
that peer has fewer than `max_pending_per_peer` connections still in their handshake (each ends
by QUIC's idle timeout if it never completes), and something in it decrypted; every connection's
ids are indexed per connection, so forgetting one costs O(its ids) (kafila.net.connections).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from aioquic.buffer import Buffer
from aioquic.quic.packet import (
    QuicHeader,
    QuicPacketType,
    QuicProtocolVersion,
    encode_quic_retry,
    pull_quic_header,
)

from kafila.errors import ProtocolError, SessionError
from kafila.net import events as ev
from kafila.net import stun, wire
from kafila.net.connections import Connections
from kafila.net.directpath import DirectPaths
from kafila.net.pmtu import DEFAULT_CEILING, PmtuConfig, PmtuSearch
from kafila.net.punch import RELAY_PATH, PunchConfig, Puncher, PunchState
from kafila.net.quic import Identity, PinnedQuicConnection, configuration
from kafila.net.rdvhealth import RendezvousHealth
from kafila.net.retry import RetryTokens
from kafila.net.trust import VerifiedMember, pair_punch_key

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]
MIN_INITIAL = 1200  # RFC 9000 §14.1: a client's Initial is padded to at least this
HOST_CID_LEN = 8  # aioquic's connection ids (QuicConfiguration.connection_id_length's default)


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
        self.punch_key: bytes | None = None  # the session's salt of every pair's punch key, once we are in one
        self.peers: dict[bytes, VerifiedMember] = {}  # verified members, kept by the membership layer
        self._punchers: dict[bytes, Puncher] = {}
        self._paths = DirectPaths(self.config.allow_direct)  # punches propose direct paths; connections validate
        self._conns = Connections()
        self._retry = RetryTokens()  # Initials come back with one before they take a handshake slot
        self._out: list[tuple[bytes, Addr]] = []
        self._events: deque[ev.Event] = deque()
        self._next_ping: float | None = None
        self._next_rejoin: float | None = None
        self._rdv = RendezvousHealth(self.config.rendezvous_probe_s, self.config.lost_after_s)

    @property
    def rendezvous_lost(self) -> ev.RendezvousLost | None:
        """Why the rendezvous is lost, while it is; None while it answers."""
        return self._rdv.lost

    # ---- the caller's interface ---------------------------------------------------------

    def receive_datagram(self, data: bytes, addr: Addr, now: float) -> None:
        """Handle one datagram from the socket; malformed ones are dropped (logged at debug)."""
        if addr == self.rendezvous and self._rdv.heard_at is not None:
            back = self._rdv.heard(addr, now)
            if back is not None:
                self._events.append(back)
        try:
            kind = wire.kind_of(data)
            if kind == "stun":
                msg = stun.decode(data)
                if msg.msg_type == stun.BINDING_SUCCESS:
                    self._events.append(ev.StunReceived(msg))
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
        while self._conns.dirty:
            self._drain(self._conns.dirty.pop(), now)
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """When handle_timer() next has something to do (None: nothing scheduled)."""
        times = [t for t in (self._next_ping, self._next_rejoin, *self._rdv.timers()) if t is not None]
        times += [t for c in self._conns.ids if (t := c.get_timer()) is not None]
        times += [t for p in self._punchers.values() if (t := p.next_wakeup()) is not None]
        times += [t for p in self._punchers.values() if (t := self._paths.next_wakeup(p)) is not None]
        times += [t for s in self._conns.pmtu.values() if (t := s.next_wakeup()) is not None]
        return min(times, default=None)

    def handle_timer(self, now: float) -> None:
        """Run whatever is due: QUIC timers, keepalive pings, punch schedules, the rendezvous re-join."""
        for conn in list(self._conns.ids):
            t = conn.get_timer()
            if t is not None and t <= now:
                conn.handle_timer(now)
                self._conns.dirty.add(conn)
        for conn, search in self._conns.pmtu.items():
            t = search.next_wakeup()
            if t is not None and t <= now:
                self._conns.dirty.add(conn)  # _drain sends the probe
        if self._next_ping is not None and now >= self._next_ping:
            self._next_ping = now + self.config.keepalive_s
            for conn in self._conns.established:
                conn.send_ping(0)  # keeps the NAT mapping and the QUIC idle timer alive
                self._conns.dirty.add(conn)
        for p in list(self._punchers.values()):
            self._run_puncher(p, p.poll(now), now)
        if self._next_rejoin is not None and now >= self._next_rejoin:
            self._next_rejoin = now + self.config.rejoin_s
            self._events.append(ev.RejoinDue())
        probe_at, lost_at = self._rdv.timers()
        if lost_at is not None and now >= lost_at:
            self._lose_rendezvous(now)
        elif probe_at is not None and now >= probe_at and self.rendezvous is not None:
            self._out.append((self._rdv.probe(now), self.rendezvous))

    def next_event(self) -> ev.Event | None:
        """The oldest event not yet taken, or None."""
        return self._events.popleft() if self._events else None

    # ---- commands -----------------------------------------------------------------------

    def joined(self, rendezvous: Addr, punch_key: bytes, now: float) -> None:
        """We are registered in a session: punch with its key, re-join periodically."""
        self.rendezvous, self.punch_key = rendezvous, punch_key
        self._next_rejoin = now + self.config.rejoin_s
        self._rdv.joined(now)
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
        self._conns.index(conn, conn.host_cid)
        self._conns.dirty.add(conn)
        return conn

    def send_stream(self, conn: PinnedQuicConnection, data: bytes) -> None:
        """Queue bytes on a connection's stream 0."""
        conn.send_stream_data(0, data)
        self._conns.dirty.add(conn)

    def touch(self, conn: PinnedQuicConnection) -> None:
        """The caller changed a connection directly: include it in the next datagrams_to_send."""
        self._conns.dirty.add(conn)

    def close(self, conn: PinnedQuicConnection, reason: str) -> None:
        """Close a connection, telling the peer why."""
        conn.close(error_code=0x100, reason_phrase=reason[:200])
        self._conns.dirty.add(conn)

    def start_punch(self, member_id: bytes, now: float) -> None:
        """Start punching toward a peer (no-op with direct paths off or an unlisted peer)."""
        if self.config.allow_direct:
            p = self._puncher(member_id)
            if p is not None:
                p.start(now)

    def path_to(self, member_id: bytes) -> str:
        """'direct' when packets to this member go straight to it, else 'relay'."""
        return "direct" if self._paths.route(self._punchers.get(member_id)) is not None else "relay"

    def punch_outcome(self, member_id: bytes) -> tuple[bool, float | None]:
        """(settled, when the direct path was validated): settled once punching has an outcome or never began."""
        p = self._punchers.get(member_id)
        if not self.config.allow_direct or p is None:
            return True, None
        return self._paths.outcome(p)

    def mtu_search(self, conn: PinnedQuicConnection) -> PmtuSearch | None:
        """The connection's path MTU search (None before its handshake, or with the search off)."""
        return self._conns.pmtu.get(conn)

    def _lose_rendezvous(self, now: float) -> None:
        """The rendezvous is silent: end every connection it relays now, with why (QUIC's idle timeout would not)."""
        assert self.rendezvous is not None
        relayed = [c for c in self._conns.ids if self.path_to(c.peer.member_id) == "relay"]
        lost = self._rdv.lose(self.rendezvous, len(relayed), now)
        for conn in relayed:
            conn.close(error_code=0x100, reason_phrase=lost.reason[:200])  # the peer never hears it: no relay
            self._conns.forget(conn)
            self._events.append(ev.ConnectionEnded(conn, lost.reason))
        self._events.append(lost)

    @property
    def connections(self) -> list[PinnedQuicConnection]:
        """Every connection the core still drives."""
        return list(self._conns.ids)

    # ---- frames ---------------------------------------------------------------------------

    def _on_frame(self, frame: wire.Frame, addr: Addr, now: float) -> None:
        if isinstance(frame, wire.Control):
            if frame.kind == wire.RESPONSE and addr == self.rendezvous:
                self._events.append(ev.ControlReceived(frame.request_id, frame.body))
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
                self._events.append(ev.PeerUnknown(member_id))
                return None
            try:  # the pair's own key: a third member of the session can make no frame of ours or theirs
                key = pair_punch_key(self.punch_key, self.member_id, self.identity.punch_private, member_id,
                                     peer.punch_public)
            except ValueError as exc:
                log.warning("no direct path to %s: %s", peer.short_id, exc)
                return None
            cands = [a for a in (peer.mapped, peer.local, peer.observed) if a is not None]
            p = Puncher(self.member_id, member_id, key, cands, self.punch_config)
            self._punchers[member_id] = p
        return p

    def _on_punch(self, frame: wire.Punch, addr: Addr, now: float) -> None:
        if not self.config.allow_direct or frame.receiver != self.member_id:
            return
        p = self._puncher(frame.sender)
        if p is not None:  # the puncher checks the MAC and the frame's freshness
            self._run_puncher(p, p.on_frame(frame, addr, now), now)

    def _run_puncher(self, p: Puncher, out: list[tuple[bytes, Addr]], now: float) -> None:
        """Route a puncher's datagrams, challenge the direct path it proposes, report a change of the path."""
        for data, dst in out:
            self._relay_to(data, p.peer) if dst == RELAY_PATH else self._out.append((data, dst))
        self._challenge(p, now)
        self._report(p, now)

    def _challenge(self, p: Puncher, now: float) -> None:
        """Challenge the direct address the punch proposes, when due, on every established connection to the peer."""
        conns = [c for c in self._conns.established if c.peer.member_id == p.peer]
        if (proposed := self._paths.due(p, now, ready=bool(conns))) is not None:
            self._out += [(c, proposed) for conn in conns if (c := conn.path_challenge(proposed, now)) is not None]

    def _report(self, p: Puncher, now: float) -> None:
        """Tell the caller the path changed (DIRECT once a connection validated the punch's address)."""
        if (change := self._paths.change(p)) is not None:
            self._events.append(change)
            if PunchState.DIRECT in (change.before, change.after):
                self._conns.new_path(p.peer, self._ceiling(p.peer), now)

    def _relay_to(self, payload: bytes, peer: bytes) -> None:
        if self.rendezvous is None:
            return
        if 1 + wire.ID_LEN + len(payload) > wire.MAX_DATAGRAM:  # built for a direct path that has just gone:
            # dropped, as a path drops what it cannot carry (QUIC sends its data again at the relay's size)
            log.debug("a %d-byte datagram does not fit the relay's envelope: dropped", len(payload))
            return
        self._out.append((wire.encode_relay(wire.RELAY, peer, payload), self.rendezvous))

    def _ceiling(self, member_id: bytes) -> int:
        """The largest datagram worth probing toward a peer: its direct route's, or the relay's envelope."""
        direct = self._paths.route(self._punchers.get(member_id))
        if direct is None or self.config.route_limit is None:
            return DEFAULT_CEILING  # with the relay's 9-byte envelope still within wire.MAX_DATAGRAM
        return self.config.route_limit(direct) or DEFAULT_CEILING

    def _send_to_peer(self, member_id: bytes, data: bytes, established: bool = False) -> None:
        p = self._punchers.get(member_id)
        if (direct := self._paths.route(p)) is not None:
            self._out.append((data, direct))
            return
        self._relay_to(data, member_id)
        if not established and p is not None and (proposed := self._paths.proposed(p)) is not None:
            self._out.append((data, proposed))  # a handshake has no keys to validate with: both ways, in case

    # ---- QUIC -----------------------------------------------------------------------------

    def _on_quic(self, member_id: bytes, data: bytes, now: float) -> None:
        if not data[0] & 0x80:  # a short header (nearly every packet): its destination id is the next 8 bytes
            conn = self._conns.by_cid.get(data[1:1 + HOST_CID_LEN])
            if conn is None:
                return
        else:
            try:
                header = pull_quic_header(Buffer(data=data), host_cid_length=HOST_CID_LEN)
            except ValueError:
                return
            conn = self._conns.by_cid.get(header.destination_cid)
            if conn is None:
                if header.packet_type == QuicPacketType.INITIAL and len(data) >= MIN_INITIAL:
                    self._initial(member_id, header, data, now)
                return
        if conn.peer.member_id != member_id:
            return  # a connection id belonging to another peer: never cross edges
        conn.receive_datagram(data, vaddr(member_id), now)
        if conn.validated_paths:  # the peer answered a challenge: that address becomes the route, if still proposed
            if (p := self._punchers.get(member_id)) is not None and self._paths.confirm(p, conn.validated_paths, now):
                self._report(p, now)
            conn.validated_paths.clear()
        self._take_events(conn)
        self._conns.dirty.add(conn)

    def _initial(self, member_id: bytes, header: QuicHeader, data: bytes, now: float) -> None:
        """A new connection's Initial: answered with a Retry, or accepted once it carries our token."""
        if member_id not in self.peers or self.punch_key is None:
            self._events.append(ev.PeerUnknown(member_id))  # a member not listed yet: its Initial will be resent
            return
        if not header.token:  # the peer proves it receives on its path before it takes a handshake slot
            token, retry_cid = self._retry.make(member_id, header.destination_cid, now)
            self._send_to_peer(member_id, encode_quic_retry(header.version or QuicProtocolVersion.VERSION_1,
                                                            retry_cid, header.source_cid, header.destination_cid,
                                                            token))
            return
        original = self._retry.check(member_id, header.token, header.destination_cid, now)
        if original is not None:  # else forged, stale or someone else's: dropped
            self._accept(member_id, header.destination_cid, original, data, now)

    def _accept(self, member_id: bytes, dcid: bytes, original: bytes, data: bytes, now: float) -> None:
        """A connection for an Initial that came back with our token: within the peer's bound of pending
        handshakes, and only when something in it decrypts."""
        peer = self.peers[member_id]
        pending = self._conns.pending.setdefault(member_id, set())
        if len(pending) >= self.config.max_pending_per_peer:
            log.debug("Initial from %s dropped: %d handshakes already pending", peer.short_id, len(pending))
            return
        conn = PinnedQuicConnection(
            peer=peer,
            configuration=configuration(self.identity, False, self.config.idle_timeout_s),
            original_destination_connection_id=original,
            retry_source_connection_id=dcid,
        )
        conn.receive_datagram(data, vaddr(member_id), now)
        out = conn.datagrams_to_send(now)
        if not out:
            return  # nothing in it decrypted (forged or corrupt): the connection is dropped before it counts
        self._conns.index(conn, dcid)
        self._conns.index(conn, conn.host_cid)
        pending.add(conn)
        self._events.append(ev.ConnectionAccepted(conn))
        self._take_events(conn)
        for packet, _addr in out:
            self._send_to_peer(member_id, packet)
        self._conns.dirty.add(conn)
        self.start_punch(member_id, now)  # the caller punches; punch back so the edge can go direct

    def _drain(self, conn: PinnedQuicConnection, now: float) -> None:
        """Send all a connection has queued and take its events."""
        if conn not in self._conns:
            return  # already forgotten
        self._take_events(conn)
        search = None  # not while a direct path awaits its validation: it would start on the relay, then over
        if (p := self._punchers.get(conn.peer.member_id)) is None or not self._paths.pending(p):
            search = self._conns.path_mtu(conn, self.config.pmtu, lambda: self._ceiling(conn.peer.member_id), now)
        else:  # e.g. its handshake just completed: the first connection able to validate the address
            self._challenge(p, now)
        for data, _addr in conn.datagrams_to_send(now):
            self._send_to_peer(conn.peer.member_id, data, conn in self._conns.established)
        if search is not None and (size := search.probe_due(now)) is not None:
            probe = conn.mtu_probe(size, search.generation, now)
            if probe is not None:
                self._send_to_peer(conn.peer.member_id, probe, True)
            else:  # could not be built: counts as a failed try, so the search never waits on it forever
                search.on_lost(size, search.generation, now)
        self._take_events(conn)  # sending can end the connection (a close that went out)

    def _take_events(self, conn: PinnedQuicConnection) -> None:
        self._events.extend(self._conns.take_events(conn))

"""The QUIC connections of one endpoint core, sans-I/O: which connection each id names, and how far each got.

Every connection's ids are indexed per connection, so forgetting one costs O(its ids) (issue #13
item 5); incoming connections still in their handshake are kept per peer, for the core to bound;
aioquic's events on a connection become the core's (kafila.net.events); an established connection's
datagram size follows its path MTU search (kafila.net.pmtu).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aioquic.quic import events as qe

from kafila.net.events import ConnectionEnded, Event, HandshakeCompleted, PingAcknowledged, StreamData
from kafila.net.pmtu import PmtuConfig, PmtuSearch
from kafila.net.quic import PinnedQuicConnection

log = logging.getLogger("kafila.net")


@dataclass
class Connections:
    """The connections a core drives, by id and by stage."""

    by_cid: dict[bytes, PinnedQuicConnection] = field(default_factory=dict)
    ids: dict[PinnedQuicConnection, set[bytes]] = field(default_factory=dict)  # every connection's ids
    pending: dict[bytes, set[PinnedQuicConnection]] = field(default_factory=dict)  # per peer: incoming, in handshake
    established: set[PinnedQuicConnection] = field(default_factory=set)
    pmtu: dict[PinnedQuicConnection, PmtuSearch] = field(default_factory=dict)  # established ones' path MTU searches
    dirty: set[PinnedQuicConnection] = field(default_factory=set)  # touched since the core last sent

    def __contains__(self, conn: PinnedQuicConnection) -> bool:
        return conn in self.ids

    def index(self, conn: PinnedQuicConnection, cid: bytes) -> None:
        """Route packets sent to `cid` to this connection."""
        self.by_cid[cid] = conn
        self.ids.setdefault(conn, set()).add(cid)

    def take_events(self, conn: PinnedQuicConnection) -> list[Event]:
        """What aioquic says happened on a connection, as the core's events; its ids and stage kept up to date."""
        out: list[Event] = []
        ev = conn.next_event()
        while ev is not None:
            if isinstance(ev, qe.ConnectionIdIssued):
                if conn in self.ids:
                    self.index(conn, ev.connection_id)
            elif isinstance(ev, qe.ConnectionIdRetired):
                self.by_cid.pop(ev.connection_id, None)
                self.ids.get(conn, set()).discard(ev.connection_id)
            elif isinstance(ev, qe.HandshakeCompleted):
                self.pending.get(conn.peer.member_id, set()).discard(conn)
                self.established.add(conn)
                out.append(HandshakeCompleted(conn))
            elif isinstance(ev, qe.StreamDataReceived) and ev.stream_id == 0:
                out.append(StreamData(conn, ev.data))
            elif isinstance(ev, qe.PingAcknowledged) and ev.uid:  # 0: the keepalive's (core.py)
                out.append(PingAcknowledged(conn, ev.uid))
            elif isinstance(ev, qe.ConnectionTerminated):
                self.forget(conn)
                out.append(ConnectionEnded(conn, ev.reason_phrase or f"QUIC error {ev.error_code}"))
            ev = conn.next_event()
        return out

    def forget(self, conn: PinnedQuicConnection) -> None:
        """Drop every trace of a connection."""
        for cid in self.ids.pop(conn, set()):
            if self.by_cid.get(cid) is conn:
                del self.by_cid[cid]
        self.pending.get(conn.peer.member_id, set()).discard(conn)
        self.established.discard(conn)
        self.pmtu.pop(conn, None)
        self.dirty.discard(conn)

    def path_mtu(self, conn: PinnedQuicConnection, config: PmtuConfig | None, ceiling: Callable[[], int],
                 now: float) -> PmtuSearch | None:
        """The connection's path MTU search (started up to `ceiling()`), fed what its probes and loss timer
        told; the size applied. None before its handshake, or with the search off."""
        if config is None or conn not in self.established:
            return None
        search = self.pmtu.get(conn)
        if search is None:
            search = self.pmtu[conn] = PmtuSearch(config)
            search.start(now, ceiling())
        for size, generation, acked in conn.mtu_outcomes:
            if acked:
                search.on_acked(size, generation, now)
            else:
                search.on_lost(size, generation, now)
        conn.mtu_outcomes.clear()
        if search.raised and (conn._loss._pto_count >= search.config.black_hole_ptos  # aioquic internal, 1.7.2
                              or conn.big_lost >= search.config.black_hole_losses):
            conn.big_lost = 0
            log.info("path to %s no longer carries %d-byte datagrams: back to %d", conn.peer.short_id,
                     search.size, search.config.base)
            search.on_black_hole(now)
        if conn.datagram_size != search.size:
            log.debug("datagrams to %s: %d -> %d bytes", conn.peer.short_id, conn.datagram_size, search.size)
            conn.set_datagram_size(search.size)
        return search

    def new_path(self, member_id: bytes, ceiling: int, now: float) -> None:
        """Packets to a peer take another path (relay <-> direct): its size is unknown, so search it again."""
        for conn, search in self.pmtu.items():
            if conn.peer.member_id == member_id:
                search.start(now, ceiling)
                conn.set_datagram_size(search.size)
                self.dirty.add(conn)

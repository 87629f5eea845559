"""PeerEndpoint: the asyncio adapter that pumps a member's EndpointCore over one UDP socket.

The protocol lives elsewhere: demultiplexing, punching, relaying and QUIC in the sans-I/O
kafila.net.core, requests to the rendezvous in kafila.net.rdvclient, the trusted member list
in kafila.net.members, ring edges in kafila.net.ring. This module only pumps, as aioquic's
asyncio protocol does: after every input it acts on the core's events, sends every datagram
the core has queued and re-arms the one timer. One clock (the loop's, or an injected one)
times everything.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import Callable, Sequence
from typing import Any

from kafila.errors import KafilaError, NetworkError, SessionError
from kafila.net import events as ev
from kafila.net import nat, wire
from kafila.net.core import CoreConfig, EndpointCore
from kafila.net.late_acks import LateAcks
from kafila.net.members import MemberList, fetch_members, merge_peers
from kafila.net.punch import PunchConfig
from kafila.net.quic import Identity, Link, LinkOwner, PinnedQuicConnection
from kafila.net.rate import LinkRate
from kafila.net.rdvclient import RendezvousClient
from kafila.net.ring import EdgeReport, RingEdges, open_ring, verify_edge
from kafila.net.trust import Announcement, JoinCode, VerifiedMember, now_wall, open_announcement
from kafila.net.udp import UdpSocket, route_payload_limit

log = logging.getLogger("kafila.net")

Addr = tuple[str, int]
REFRESH_GAP_S = 0.3  # at most one member-list refresh per this, however many unknown ids show up

__all__ = ["EdgeReport", "MemberList", "PeerEndpoint", "RingEdges"]


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
        clock: Callable[[], float] | None = None,
        on_rendezvous: Callable[[str | None], None] | None = None,
        link_delay_s: float = 0.0,
        link_rate: LinkRate | None = None,
    ) -> None:
        """`on_rendezvous` hears why the rendezvous is unreachable when it is lost, and None when it is back;
        `link_delay_s` (EMULATION) holds every datagram sent that long, as a link to a far member would;
        `link_rate` (EMULATION) caps what this endpoint sends and receives, as a home connection would."""
        self.bind, self.name = bind, name
        self.link_delay_s, self.link_rate = link_delay_s, link_rate
        self.identity = identity or Identity(name)
        self.member_id = secrets.token_bytes(wire.ID_LEN)
        self.allow_direct = allow_direct
        self.punch_config = punch or PunchConfig()
        config = CoreConfig(allow_direct=allow_direct, idle_timeout_s=idle_timeout_s, keepalive_s=keepalive_s,
                            rejoin_s=rendezvous_ping_s, route_limit=route_payload_limit)
        self.core = EndpointCore(self.member_id, self.identity, config, self.punch_config)
        self.rdv = RendezvousClient(self.member_id, self._sendto)
        self.nat_report: nat.NatReport | None = None
        self.me: VerifiedMember | None = None
        self._clock = clock
        self._on_rendezvous = on_rendezvous
        self._socket: UdpSocket | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._wake = asyncio.Event()
        self._ticker_at = float("inf")  # when the sleeping ticker wakes by itself
        self._links: dict[PinnedQuicConnection, Link] = {}
        self.late_acks = LateAcks(self._ack_now)  # links acknowledging every second datagram
        self._accepted: asyncio.Queue[Link] = asyncio.Queue(maxsize=64)
        self._path_events: dict[bytes, asyncio.Event] = {}
        self._rejoin_task: asyncio.Task[None] | None = None
        self._closing = False
        self._in_transmit = False
        self._last_refresh = float("-inf")
        self.local_addr: Addr = ("0.0.0.0", 0)

    # ---- what the rest of the package reads --------------------------------------------------

    @property
    def rendezvous(self) -> Addr | None:
        """The rendezvous this member talks to (set by probe_nat, create_session or join_session)."""
        return self.rdv.rendezvous

    @rendezvous.setter
    def rendezvous(self, addr: Addr | None) -> None:
        self.rdv.rendezvous = self.core.rendezvous = addr

    @property
    def code(self) -> JoinCode | None:
        """The join code of our session, once joined."""
        return self.rdv.code

    @property
    def peers(self) -> dict[bytes, VerifiedMember]:
        """Verified members by id (the core routes and pins with these)."""
        return self.core.peers

    def now(self) -> float:
        """The endpoint's one clock."""
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # ---- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> PeerEndpoint:
        loop = asyncio.get_running_loop()
        try:
            rate = self.link_rate
            self._socket = UdpSocket(loop, self.bind, self._on_batch, self.link_delay_s,
                                     rate.uplink() if rate else None, rate.downlink() if rate else None)
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
        self.rdv.leave()
        self._closing = True
        self._wake.set()
        self._ticker_task.cancel()
        self.late_acks.close()
        if self._rejoin_task is not None:
            self._rejoin_task.cancel()
        assert self._tg is not None
        try:
            await self._tg.__aexit__(None, None, None)
        except BaseExceptionGroup as eg:  # a failed background refresh must not hide the caller's error
            log.debug("endpoint tasks ended with %s", eg)
        if self._socket is not None:
            self._socket.close()

    def _sendto(self, data: bytes, addr: Addr) -> None:
        if self._socket is not None:
            self._socket.sendto(data, addr)

    # ---- the pump -----------------------------------------------------------------------------

    def _on_batch(self, batch: list[tuple[bytes, Addr]]) -> None:
        """Feed every datagram of a wake-up to the core first, then act and send once."""
        now = self.now()
        for data, addr in batch:
            self.core.receive_datagram(data, addr, now)
        self._transmit()
        self.late_acks.received()

    def _transmit(self) -> None:
        """Act on the core's events and send what it queued until it has nothing more; re-arm the timer."""
        if self._in_transmit:
            return  # a Link wrote while we handle events: the loop below sends it
        self._in_transmit = True
        try:
            while True:
                handled = self._handle_events()
                out = self.core.datagrams_to_send(self.now())
                for data, addr in out:
                    self._sendto(data, addr)
                if not out and not handled:
                    break
        finally:
            self._in_transmit = False
        for link in list(self._links.values()):
            if link.blocked:
                link.on_progress()
        self._rearm()

    def _ack_now(self, conns: list[PinnedQuicConnection]) -> None:
        now = self.now()
        for conn in conns:
            conn.ack_now(now)
            self.core.touch(conn)
        self._transmit()

    def _rearm(self) -> None:
        t = self.core.get_timer()
        if t is not None and t < self._ticker_at:
            self._wake.set()  # the ticker sleeps past the core's next timer

    def _handle_events(self) -> int:
        n = 0
        while (e := self.core.next_event()) is not None:
            n += 1
            if isinstance(e, ev.StunReceived):
                self.rdv.on_stun(e.msg)
            elif isinstance(e, ev.ControlReceived):
                self.rdv.on_control(e.request_id, e.body)
            elif isinstance(e, ev.ConnectionAccepted):
                self._links[e.conn] = Link(self, e.conn)
            elif isinstance(e, ev.HandshakeCompleted):
                if (link := self._links.get(e.conn)) is not None:
                    link.on_handshake()
            elif isinstance(e, ev.StreamData):
                if (link := self._links.get(e.conn)) is not None:
                    link.on_stream_data(e.data)
            elif isinstance(e, ev.PingAcknowledged):
                if (link := self._links.get(e.conn)) is not None:
                    link.on_ping_acknowledged(e.uid)
            elif isinstance(e, ev.ConnectionEnded):
                self.late_acks.discard(e.conn)
                if (link := self._links.pop(e.conn, None)) is not None:
                    link.on_terminated(e.reason if link.closed is None else link.closed)
            elif isinstance(e, ev.PeerUnknown):
                self._schedule_refresh()
            elif isinstance(e, ev.PathChanged):
                if (waiter := self._path_events.get(e.member_id)) is not None:
                    waiter.set()
            elif isinstance(e, ev.RejoinDue):
                self._start_rejoin()
            elif isinstance(e, ev.RendezvousLost | ev.RendezvousBack):
                self._rendezvous_changed(e)
        return n

    async def _ticker(self) -> None:
        """The one timer: sleeps until the core's next timer (or an input moves it earlier), then runs it."""
        while not self._closing:
            now = self.now()
            t = self.core.get_timer()
            if t is not None and t <= now:
                self.core.handle_timer(now)
                self._transmit()
                t = self.core.get_timer()
            self._wake.clear()
            if self._closing:
                return
            self._ticker_at = t if t is not None else float("inf")
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                async with asyncio.timeout(None if t is None else max(0.001, t - self.now())):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _rendezvous_changed(self, e: ev.RendezvousLost | ev.RendezvousBack) -> None:
        ip, port = e.rendezvous
        if isinstance(e, ev.RendezvousBack):
            log.info("the rendezvous %s:%d answers again; re-registering", ip, port)
            self._start_rejoin()  # at once: a restarted rendezvous must learn our session again
        if self._on_rendezvous is not None:
            self._on_rendezvous(None if isinstance(e, ev.RendezvousBack) else (
                f"the rendezvous {ip}:{port} is unreachable (silent for {e.silent_s:.0f} s): direct edges serve on,"
                f" {e.closed} relayed link(s) through it were lost"))

    def _start_rejoin(self) -> None:
        """Re-join in the background, one at a time (two would spend each other's nonces)."""
        if self._tg is None or self._closing:
            return
        if self._rejoin_task is None or self._rejoin_task.done():
            self._rejoin_task = self._tg.create_task(self.rdv.rejoin())

    # ---- LinkOwner --------------------------------------------------------------------------

    def path_to(self, member_id: bytes) -> str:
        """'direct' when packets to this member go straight to it, else 'relay'."""
        return self.core.path_to(member_id)

    def flush(self, link: Link) -> None:
        """Send whatever the link's connection has queued."""
        self.core.touch(link.conn)
        self._transmit()

    def ack_every_second(self, link: Link) -> None:
        """The link acknowledges every second datagram (Link.ack_every_second)."""
        self.late_acks.add(link.conn)

    def close_link(self, link: Link, reason: str) -> None:
        """Close a link's connection, telling the peer why."""
        if link.closed is None:
            link.closed = reason
            log.info("link to %s closed: %s", link.peer.short_id, reason)
        self.core.close(link.conn, reason)
        self._transmit()
        link.on_terminated(reason)

    def link_ready(self, link: Link) -> None:
        """A peer's incoming link passed the handshake: hand it to accept()."""
        if not link.is_client:
            try:
                self._accepted.put_nowait(link)
            except asyncio.QueueFull:
                self.close_link(link, "too many unaccepted links")

    # ---- public API: probing and sessions ------------------------------------------------------

    async def probe_nat(self, rendezvous: Addr, timeout_s: float = 0.3, tries: int = 2) -> nat.NatReport:
        """Classify this member's NAT against the rendezvous (also sets it as our rendezvous)."""
        self.rendezvous = rendezvous
        self.nat_report = await nat.probe(self.rdv.stun_request, rendezvous, timeout_s, tries)
        log.info("NAT %s", self.nat_report.summary())
        return self.nat_report

    async def create_session(self, rendezvous: Addr, secret: str | None = None) -> JoinCode:
        """Ask the rendezvous for a new session (we make the secret; it never sees it), and join it."""
        self.rendezvous = rendezvous
        code = await self.rdv.create(rendezvous, secret)
        self._joined(rendezvous, code)
        return code

    async def join_session(self, rendezvous: Addr, code: JoinCode | str) -> None:
        """Join with a code; WrongJoinCode / UnknownSession (SessionErrors) when the rendezvous refuses it."""
        self.rendezvous = rendezvous
        self._joined(rendezvous, await self.rdv.join(rendezvous, code))

    def _joined(self, rendezvous: Addr, code: JoinCode) -> None:
        self.core.joined(rendezvous, code.punch_key, self.now())
        self._rearm()

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
            rtt_ms=None if self.nat_report.rtt_ms is None else round(self.nat_report.rtt_ms, 2),
            measurements=measurements or {},
            issued_at=now_wall(),
            punch_public=self.identity.punch_public,
        )
        sealed = ann.seal(self.code)
        await self.rdv.announce(sealed)
        self.me = open_announcement(sealed, self.code, self.member_id)
        return self.me

    async def members(self) -> MemberList:
        """Every listed member whose announcement verifies under our join code; the others, refused.

        While the rendezvous is unreachable, the members verified before it went: they still are who
        they were, and direct edges to them need nothing from it.
        """
        if self.core.rendezvous_lost is None:
            try:
                ml = await fetch_members(self.rdv, self.peers)
            except NetworkError:
                if not self.peers:
                    raise
                log.info("the rendezvous did not list the members: using the %d verified before", len(self.peers))
            else:
                merge_peers(self.peers, ml)
                return ml
        return MemberList(tuple(self.peers.values()), ())

    async def wait_for_members(self, n: int, timeout_s: float = 30.0, poll_s: float = 0.2) -> MemberList:
        """Poll the member list until at least n members verify; NetworkError after timeout_s."""
        deadline = self.now() + timeout_s
        while True:
            ml = await self.members()
            if len(ml.verified) >= n:
                return ml
            if self.now() > deadline:
                raise NetworkError(f"only {len(ml.verified)} of {n} members joined within {timeout_s:.0f} s")
            await asyncio.sleep(poll_s)

    def _schedule_refresh(self) -> None:
        now = self.now()
        if self._tg is None or self._closing or self.code is None or now - self._last_refresh < REFRESH_GAP_S:
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
        t0 = self.now()
        conn = self.core.connect(peer, t0)
        link = Link(self, conn, ready_timeout_s=timeout_s)
        link.opened_at = t0
        self._links[conn] = link
        self._transmit()
        await link.wait_ready()
        link.ready_at = self.now()
        log.info("link to %s ready in %.1f ms via %s", peer.short_id, (link.ready_at - t0) * 1000, link.path)
        return link

    async def accept(self, timeout_s: float = 30.0) -> Link:
        """The next incoming link (pins checked both ways); TimeoutError after timeout_s."""
        async with asyncio.timeout(timeout_s):
            return await self._accepted.get()

    def requeue(self, link: Link) -> None:
        """Put an accepted link back for the next accept() (it was meant for another caller)."""
        self._accepted.put_nowait(link)

    async def settle_path(self, peer: VerifiedMember, timeout_s: float | None = None) -> str:
        """Wait (bounded) until punching toward peer has an outcome; 'direct' or 'relay'."""
        limit = timeout_s if timeout_s is not None else self.punch_config.window_s + 0.5
        deadline = self.now() + limit
        waiter = self._path_events.setdefault(peer.member_id, asyncio.Event())
        while not self.core.punch_outcome(peer.member_id)[0] and self.now() < deadline:
            waiter.clear()
            try:
                async with asyncio.timeout(deadline - self.now()):
                    await waiter.wait()  # set on every change of the punch state toward this peer
            except TimeoutError:
                break
        return self.path_to(peer.member_id)

    def direct_since(self, member_id: bytes) -> float | None:
        """When (endpoint clock) the direct path to a member was proven, if it was."""
        return self.core.punch_outcome(member_id)[1]

    async def verify_edge(self, peer: VerifiedMember, timeout_s: float = 10.0) -> tuple[Link | None, EdgeReport]:
        """Connect to peer and record predicted vs actual path and the time to a usable link."""
        return await verify_edge(self, peer, timeout_s)

    async def open_ring(self, order: Sequence[VerifiedMember], timeout_s: float = 15.0) -> RingEdges:
        """Open exactly this member's two ring edges: connect to the successor, accept the predecessor."""
        return await open_ring(self, order, timeout_s)

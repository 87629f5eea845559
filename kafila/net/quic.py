"""QUIC pieces: self-signed identities, pinned TLS 1.3 configuration, and the Link message stream.

Each member mints an ECDSA P-256 certificate at start; its identity is the SHA-256 of the
certificate's SubjectPublicKeyInfo. Both sides present certificates (the server asks for the
client's through aioquic's internal flag, see PinnedQuicConnection) and both check the peer's
fingerprint against the one in its verified announcement before any application byte flows.

A Link carries length-prefixed messages on stream 0: u32 big-endian length | bytes. The first
message each way is a handshake word (HELLO from the client, WELCOME from the server), so a
link counts as usable only once both ends have checked each other's pin.

Link transitions:

    state        event                               -> state        action
    handshaking  TLS done, peer pin matches          -> pinned       client writes HELLO
    handshaking  TLS done, pin missing or different  -> closed       CONNECTION_CLOSE with the reason
    pinned       server reads HELLO                  -> ready        writes WELCOME, hands link to accept()
    pinned       client reads WELCOME                -> ready        connect() returns
    pinned       anything else first                 -> closed       "did not start with the handshake"
    ready        a whole message                     -> ready        queued for recv()
    any          ConnectionTerminated / close()      -> closed       recv()/send() raise NetworkError
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ssl
import struct
from collections import deque
from typing import TYPE_CHECKING

from aioquic import tls as quic_tls
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.x509.oid import NameOID

from kafila.errors import NetworkError, ProtocolError
from kafila.net.quic_probes import PathProbes

if TYPE_CHECKING:
    from kafila.net.trust import VerifiedMember

ALPN = "kafila/1"
MAX_MESSAGE = 256 * 1024 * 1024
HELLO = b"kafila-hello-v1"
WELCOME = b"kafila-welcome-v1"
SEND_BUFFER_HIGH = 8 * 1024 * 1024  # send() waits while more than this is unacknowledged
# The receive windows: at most this much arrives ahead of what is reassembled (e.g. after a lost datagram).
STREAM_WINDOW = 32 * 1024 * 1024
# A postponed acknowledgement (ack_every) goes out this late at the latest: below the 25 ms max_ack_delay
# aioquic announces, so the peer's loss timer allows for it.
ACK_LATE_S = 0.02


def fingerprint(cert: x509.Certificate) -> bytes:
    """SHA-256 of the certificate's SubjectPublicKeyInfo (the pin)."""
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).digest()


class Identity:
    """An ephemeral self-signed certificate and its key, and the X25519 key pair of its punch frames."""

    def __init__(self, name: str = "kafila-member") -> None:
        self.punch_private = X25519PrivateKey.generate()  # kafila.net.trust.pair_punch_key
        self.punch_public = self.punch_private.public_key().public_bytes(serialization.Encoding.Raw,
                                                                         serialization.PublicFormat.Raw)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:60] or "kafila")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .sign(self.key, hashes.SHA256())
        )
        self.fingerprint = fingerprint(self.cert)


def configuration(identity: Identity, is_client: bool, idle_timeout_s: float) -> QuicConfiguration:
    """TLS 1.3 with our certificate on both sides, chain checks off (we pin instead), big windows."""
    return QuicConfiguration(
        alpn_protocols=[ALPN],
        is_client=is_client,
        certificate=identity.cert,
        private_key=identity.key,
        verify_mode=ssl.CERT_NONE,  # no CA: the fingerprint pin below replaces chain checks
        idle_timeout=idle_timeout_s,
        # Long-RTT links carry multi-MB activations and stage files: 1 MiB windows would cap
        # throughput at 1 MiB per round trip.
        max_data=2 * STREAM_WINDOW,
        max_stream_data=STREAM_WINDOW,
        server_name="kafila",
    )


class PinnedQuicConnection(PathProbes):
    """A QuicConnection that knows which fingerprint its peer must present (probes: kafila.net.quic_probes)."""

    def __init__(self, *, peer: VerifiedMember, configuration: QuicConfiguration, **kw: object) -> None:
        super().__init__(configuration=configuration, **kw)  # type: ignore[arg-type]
        self.peer = peer
        # Acknowledge in the same pass that reads the packets (aioquic waits 1 ms by default): a ring
        # edge carries one direction only, so the ACK cannot ride on a reply, and a delayed one took
        # a wake-up of its own in the middle of the next stage's llama.cpp call. Internal attribute,
        # checked with aioquic 1.7.2 (pinned).
        self._ack_delay = 0.0
        self._ack_every = 1
        self._unacked = 0  # ack-eliciting datagrams received since the last acknowledgement, when postponing

    def _initialize(self, peer_cid: bytes) -> None:
        # A Retry starts the handshake again (RFC 9002 §6.3: loss recovery and congestion state reset), but
        # aioquic 1.7.2 replaces the packet spaces without discarding them: the first Initial stayed in bytes
        # in flight for the connection's life, shrinking the congestion window by a datagram for good.
        for space in self._loss.spaces:
            self._loss.discard_space(space)
        super()._initialize(peer_cid)
        if not self._is_client:
            # aioquic has no public switch to ask for a client certificate (aioquic#541); this
            # internal flag is it. Checked with aioquic 1.7.2 (pinned in requirements.txt).
            self.tls._request_client_certificate = True

    # ---- path MTU (kafila.net.pmtu decides the sizes; quic_probes builds the probes) ----------------------
    # aioquic has no public API to change a live connection's datagram size: internal attributes of aioquic
    # 1.7.2 (pinned in requirements.txt).

    @property
    def datagram_size(self) -> int:
        """The largest datagram this connection builds now."""
        return int(self._max_datagram_size)

    def set_datagram_size(self, size: int) -> None:
        """Build datagrams of up to `size` bytes from now on (congestion control counts in the same unit)."""
        self._max_datagram_size = size
        for part in (self._loss._cc, self._loss._pacer):
            if hasattr(part, "_max_datagram_size"):
                part._max_datagram_size = size
        if hasattr(self._loss._cc, "additive_increase_factor"):  # cubic's per-RTT growth is one datagram
            self._loss._cc.additive_increase_factor = size

    def ack_every(self, n: int) -> None:
        """Acknowledge every n-th ack-eliciting datagram at once; the ACK covers the ones before it (RFC 9000
        §13.2.2 asks for at least every second). The caller sends a postponed one by ack_now() in time."""
        self._ack_every = n

    def receive_datagram(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        super().receive_datagram(data, addr, now)
        if self._ack_every > 1:
            space = self._spaces.get(quic_tls.Epoch.ONE_RTT)
            if space is not None and space.ack_at is not None:
                self._unacked += 1
                if self._unacked < self._ack_every:
                    space.ack_at = None  # the next one's ACK covers it: ack_queue keeps its number
                else:
                    self._unacked = 0

    @property
    def ack_postponed(self) -> bool:
        """An ack-eliciting datagram is waiting for the next one's acknowledgement."""
        return self._unacked > 0

    def ack_now(self, now: float) -> None:
        """Acknowledge what ack_every postponed in the next datagrams_to_send."""
        space = self._spaces.get(quic_tls.Epoch.ONE_RTT)
        if self._unacked and space is not None:
            space.ack_at = now
        self._unacked = 0

    def pin_error(self) -> str | None:
        """None when the peer's certificate matches the pin, else why not."""
        cert = getattr(self.tls, "_peer_certificate", None)
        if cert is None:
            return f"peer {self.peer.short_id} presented no certificate"
        got = fingerprint(cert)
        if got != self.peer.fingerprint:
            return (
                f"peer {self.peer.short_id} presented certificate {got.hex()[:16]}…, but its verified announcement "
                f"pins {self.peer.fingerprint.hex()[:16]}… (someone is in the middle): refused"
            )
        return None


def unacked_bytes(conn: QuicConnection) -> int:
    """Bytes written to stream 0 and not yet acknowledged by the peer.

    aioquic has no public API for this; it reads the stream sender's buffer bounds (internal
    attributes, checked with aioquic 1.7.2, pinned in requirements.txt) in this one place.
    """
    stream = conn._streams.get(0)
    return 0 if stream is None else stream.sender._buffer_stop - stream.sender._buffer_start


class Link:
    """One QUIC connection to a verified peer, carrying whole messages both ways.

    `path` is "direct" or "relay" right now (it can change from relay to direct while in use).
    """

    def __init__(self, owner: LinkOwner, conn: PinnedQuicConnection, ready_timeout_s: float = 10.0) -> None:
        self._owner = owner
        self.conn = conn
        self.peer: VerifiedMember = conn.peer
        self.is_client = conn._is_client
        self._inbox: deque[bytes] = deque()
        # recv() calls waiting for a message (or the end); a plain future each, woken by _wake: a ring stage's
        # every frame passes here, and a recv() built on Queue.get with a close watcher cost two tasks and an
        # asyncio.wait a message
        self._waiters: list[asyncio.Future[None]] = []
        self._buf = bytearray()
        self._need: int | None = None
        self._handshake_done = False
        self.ready = asyncio.Event()  # HELLO/WELCOME exchanged: usable
        self.closed: str | None = None  # reason, once terminated
        self._closed_event = asyncio.Event()
        self._progress = asyncio.Event()
        self._waiting = 0  # send() calls waiting for acknowledgements
        self.ready_timeout_s = ready_timeout_s
        self.opened_at: float | None = None  # loop time when connect() began (client side)
        self.ready_at: float | None = None  # loop time when the link became usable
        self._pings: dict[int, asyncio.Future[None]] = {}  # PINGs ping() sent, by uid (0 is the keepalive's)

    @property
    def path(self) -> str:
        """'direct' or 'relay': how packets to this peer travel right now."""
        return self._owner.path_to(self.peer.member_id)

    @property
    def rtt_ms(self) -> float | None:
        """QUIC's smoothed round-trip time to the peer so far (None before a sample). Internal attributes of
        aioquic 1.7.2's loss recovery (pinned)."""
        loss = self.conn._loss
        return loss._rtt_smoothed * 1e3 if loss._rtt_initialized else None

    # -- events from the endpoint --------------------------------------------------------

    def on_handshake(self) -> None:
        err = self.conn.pin_error()
        if err is not None:
            self._owner.close_link(self, err)
            return
        self._handshake_done = True
        if self.is_client:
            self._write(HELLO)

    def on_stream_data(self, data: bytes) -> None:
        if not self._handshake_done:
            return
        self._buf += data
        while True:
            if self._need is None:
                if len(self._buf) < 4:
                    return
                (self._need,) = struct.unpack_from("!I", self._buf)
                del self._buf[:4]
                if self._need > MAX_MESSAGE:
                    self._owner.close_link(self, f"peer sent a {self._need}-byte message (limit {MAX_MESSAGE})")
                    return
            if len(self._buf) < self._need:
                return
            msg = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            self._need = None
            self._on_message(msg)

    def _on_message(self, msg: bytes) -> None:
        if self.ready.is_set():
            self._inbox.append(msg)
            self._wake()
        elif not self.is_client and msg == HELLO:
            self._write(WELCOME)
            self.ready.set()
            self._owner.link_ready(self)
        elif self.is_client and msg == WELCOME:
            self.ready.set()
        else:
            self._owner.close_link(self, "peer did not start the link with the Kafila handshake")

    def on_ping_acknowledged(self, uid: int) -> None:
        if (fut := self._pings.pop(uid, None)) is not None:
            fut.set_result(None)

    def on_terminated(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
        while self._pings:  # a ping waiting on a link that ended is unanswered: ping() says so
            self._pings.popitem()[1].set_result(None)
        self._closed_event.set()
        self._progress.set()  # a blocked send() wakes to raise
        self._wake()  # and a waiting recv()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- public API -----------------------------------------------------------------------

    def _write(self, msg: bytes) -> None:
        self.conn.send_stream_data(0, struct.pack("!I", len(msg)) + msg)
        self._owner.flush(self)

    def _check(self) -> None:
        if self.closed is not None:
            raise NetworkError(f"link to {self.peer.name} ({self.peer.short_id}) is closed: {self.closed}")

    def post(self, msg: bytes) -> None:
        """Queue one message, not waiting for acknowledgements: a goodbye on a congested link must not delay a close."""
        self._check()
        if len(msg) > MAX_MESSAGE:
            raise ProtocolError(f"message of {len(msg)} bytes exceeds {MAX_MESSAGE}")
        self._write(msg)

    async def send(self, msg: bytes) -> None:
        """Queue one message; waits (bounded by the link's liveness) while much is still unacknowledged."""
        self.post(msg)
        while unacked_bytes(self.conn) > SEND_BUFFER_HIGH:
            self._check()
            self._progress.clear()
            self._waiting += 1  # several tasks may send on one link: each counts itself
            try:
                await self._progress.wait()  # set by ACKs (on_progress) or the end of the link
            finally:
                self._waiting -= 1

    def ack_every_second(self) -> None:
        """Acknowledge every second datagram arriving on this link, the other within ACK_LATE_S (a ring edge's
        inbound end: see kafila.net.late_acks)."""
        self._owner.ack_every_second(self)

    @property
    def blocked(self) -> bool:
        """True while a send() waits for the peer to acknowledge."""
        return self._waiting > 0

    def on_progress(self) -> None:
        """The endpoint handled datagrams for this link: a blocked send() may go on."""
        if unacked_bytes(self.conn) <= SEND_BUFFER_HIGH:
            self._progress.set()

    async def recv(self, timeout: float | None = None) -> bytes:
        """The next whole message; NetworkError once the peer is gone (within the idle timeout)."""
        try:
            async with asyncio.timeout(timeout):
                while not self._inbox:  # messages that arrived before the end are still read
                    self._check()
                    waiter = asyncio.get_running_loop().create_future()
                    self._waiters.append(waiter)
                    try:
                        await waiter
                    finally:
                        self._waiters.remove(waiter)
        except TimeoutError:
            raise TimeoutError(f"no message from {self.peer.name} within {timeout} s") from None
        return self._inbox.popleft()

    async def ping(self, timeout_s: float) -> bool:
        """Whether the peer acknowledges a QUIC PING within `timeout_s`: its process is there and reads this link
        (lost PINGs are sent again meanwhile). False at once on a closed link."""
        if self.closed is not None:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pings[uid := id(fut)] = fut  # unique while it waits here
        self.conn.send_ping(uid)
        self._owner.flush(self)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return False
        finally:
            self._pings.pop(uid, None)
        return self.closed is None

    async def close(self) -> None:
        """Close the connection (the peer's recv raises NetworkError)."""
        self._owner.close_link(self, "closed by this side")

    async def wait_ready(self) -> None:
        """Until both ends have checked each other's pin; NetworkError on failure or timeout."""
        closer = asyncio.ensure_future(self._closed_event.wait())
        readier = asyncio.ensure_future(self.ready.wait())
        try:
            await asyncio.wait({closer, readier}, timeout=self.ready_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closer.cancel()
            readier.cancel()
        if self.ready.is_set() and self.closed is None:
            return
        if self.closed is None:
            self._owner.close_link(self, "handshake timed out")
        raise NetworkError(f"cannot open a link to {self.peer.name} ({self.peer.short_id}): {self.closed}")


class LinkOwner:
    """What a Link needs from the endpoint that pumps it."""

    def path_to(self, member_id: bytes) -> str:
        raise NotImplementedError

    def flush(self, link: Link) -> None:
        raise NotImplementedError

    def ack_every_second(self, link: Link) -> None:
        raise NotImplementedError

    def close_link(self, link: Link, reason: str) -> None:
        raise NotImplementedError

    def link_ready(self, link: Link) -> None:
        raise NotImplementedError

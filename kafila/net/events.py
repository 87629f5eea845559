"""What an EndpointCore tells its caller: one frozen dataclass per kind, taken with `next_event()`.

Connection events carry the PinnedQuicConnection they are about; path and rendezvous events say
what changed and why, so the caller (kafila.net.endpoint) only acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafila.net import stun
from kafila.net.punch import PunchState
from kafila.net.quic import PinnedQuicConnection

Addr = tuple[str, int]


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
class PingAcknowledged:
    """The peer acknowledged a PING sent with `uid` (Link.ping): it is there, and reads its packets."""

    conn: PinnedQuicConnection
    uid: int


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


Event = (StunReceived | ControlReceived | ConnectionAccepted | HandshakeCompleted | StreamData | PingAcknowledged
         | ConnectionEnded | PeerUnknown | PathChanged | RejoinDue | RendezvousLost | RendezvousBack)

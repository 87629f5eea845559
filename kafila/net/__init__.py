"""Networking: NAT probing, QUIC on one UDP socket, hole punching, relay client, wire framing.

Public API for the session layer (everything else in this package is internal):

    from kafila.net import PeerEndpoint, JoinCode, VerifiedMember, Link, NatReport, EdgeReport

    async with PeerEndpoint(bind=("0.0.0.0", 0), name="alice") as ep:
        report: NatReport = await ep.probe_nat(rdv)              # rdv = ("host", P); also sets it
        code: JoinCode = await ep.create_session(rdv)            # host: print(str(code)) for the others
        await ep.join_session(rdv, "k7q2m9xd-4f8t-zr2w-9mhc-qp3a")  # member (instead of create)
        me: VerifiedMember = await ep.announce({"bw": 2.1e9, "mem": 8e9})  # sealed; <= ~600 B of numbers
        ml = await ep.wait_for_members(n, timeout_s=30)          # ml.verified, ml.rejected (id, reason)
        link: Link = await ep.connect(peer)                      # peer: a VerifiedMember from ml.verified
        link = await ep.accept(timeout_s=30)                     # incoming, pins already checked
        ring = await ep.open_ring(order)                         # ring.next, ring.prev, ring.report
        await link.send(msg: bytes); msg = await link.recv(timeout=None)
        link.path ("direct"|"relay", may upgrade while in use), link.peer, await link.close()

PeerEndpoint(bind, identity=None, name, allow_direct=True, punch=PunchConfig(), idle_timeout_s=10,
keepalive_s=2): one UDP socket for STUN probes, rendezvous control, punch/relay frames and QUIC.
- probe_nat(rdv, timeout_s=0.3, tries=2) -> NatReport(nat_class: NatClass, mapped, evidence…, rtt_ms)
- create_session(rdv, secret=None) -> JoinCode;  join_session(rdv, code: str | JoinCode) -> None
  (SessionError "wrong join code for this session" / "no session …" / "malformed")
- announce(measurements: dict) -> VerifiedMember (self);  members() -> MemberList;
  wait_for_members(n, timeout_s) -> MemberList (NetworkError after timeout_s)
- connect(peer, timeout_s=10) -> Link: usable over the relay at once (ready in ms), punches in
  the background and moves to the direct path without the caller noticing.
- accept(timeout_s) -> Link (TimeoutError);  verify_edge(peer) -> (Link | None, EdgeReport);
  open_ring(order: Sequence[VerifiedMember]) -> RingEdges(next, prev, report): exactly this
  member's two edges (connect to the successor, accept the predecessor), with the report
  (predicted, actual direct/relay/failed, ready_ms, direct_ms) for the outgoing edge.
- Link.send(bytes) (messages up to 256 MiB; waits while > 8 MiB is unacknowledged),
  Link.recv(timeout=None) -> bytes, Link.close(); NetworkError once the peer is gone: at once
  when it closes, within idle_timeout_s (10 s) when it vanishes. Link.ping(timeout_s) -> bool:
  whether the peer acknowledges a QUIC PING in time (its process is there and reads the link).
Errors: NetworkError (unreachable, link gone), SessionError (code, membership, pinning refusals),
ProtocolError (malformed bytes; parsers never raise anything else on bad input).

Inside, each module has one job; the lower ones never import the upper ones:

    endpoint.py   PeerEndpoint: the asyncio adapter; pumps the core over one UDP socket (udp.py),
                  one timer, one clock; turns core events into Links
    ring.py       verify_edge / open_ring: a member's two ring edges and their reports, made through
                  the endpoint calls it names (EdgeEndpoint); it never imports the endpoint
    members.py    the member list as trusted: paged, every announcement verified, pins policed
    rdvclient.py  requests to the rendezvous: STUN probes, control ops with retries, join/re-join
    core.py       EndpointCore, sans-I/O: demultiplexing, QUIC connections (and their limits),
                  relay vs direct routing, punch scheduling; receive_datagram / datagrams_to_send /
                  get_timer / handle_timer / next_event
    events.py     what the core tells its caller (next_event): one frozen dataclass per kind
    connections.py  the core's QUIC connections: ids, pending handshakes, path MTU, aioquic's events
    rdvhealth.py  whether the rendezvous still answers: probed after silence, lost, back
    punch.py      the punch state machine toward one peer (pair-keyed MACs, freshness, replay window, candidates)
    directpath.py which proposed direct path carries a peer's packets: only one a connection validated
    quic.py       identities, pinned TLS configuration, the Link message stream
    quic_probes.py  one-off 1-RTT packets: path MTU probes, PATH_CHALLENGEs for proposed direct paths
    nat.py, stun.py, wire.py, frames.py, trust.py   probing, codecs, join codes and MACs
    mandate.py    a coordinator's credential: a join code made from the host's certificate, mandates to successors
"""

from kafila.net.endpoint import PeerEndpoint
from kafila.net.members import MemberList
from kafila.net.nat import NatReport
from kafila.net.punch import PunchConfig
from kafila.net.quic import Identity, Link
from kafila.net.ring import EdgeReport, RingEdges
from kafila.net.trust import JoinCode, VerifiedMember

__all__ = [
    "EdgeReport",
    "Identity",
    "JoinCode",
    "Link",
    "MemberList",
    "NatReport",
    "PeerEndpoint",
    "PunchConfig",
    "RingEdges",
    "VerifiedMember",
]

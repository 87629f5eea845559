"""One-off 1-RTT packets a PinnedQuicConnection builds outside aioquic's own schedule: path MTU probes and
the PATH_CHALLENGEs that validate a proposed direct path before the core moves a connection onto it.

aioquic has no public API to probe a path, change a live connection's datagram size or challenge an address
it does not route to itself (the core routes below a virtual address, kafila.net.core): these methods use
internal attributes of aioquic 1.7.2 (pinned in requirements.txt), in this one place.
"""

from __future__ import annotations

import os
from typing import Any

from aioquic import tls as quic_tls
from aioquic.buffer import Buffer
from aioquic.quic.connection import QuicConnection, QuicReceiveContext
from aioquic.quic.packet import QuicFrameType, QuicPacketType
from aioquic.quic.packet_builder import QuicDeliveryState, QuicPacketBuilder

Addr = tuple[str, int]
CHALLENGE_SIZE = 1200  # RFC 9000 §8.2.1: a PATH_CHALLENGE's datagram is padded to QUIC's smallest
MAX_CHALLENGES = 16  # outstanding ones per connection; older ones are forgotten (their answers then ignored)


class PathProbes(QuicConnection):
    """Path MTU probes and direct-path challenges, for the core to send where it chooses."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        # Outcomes of path MTU probes, (size, generation, acknowledged), for the core's PmtuSearch to take.
        self.mtu_outcomes: list[tuple[int, int, bool]] = []
        self._challenges: dict[bytes, Addr] = {}  # PATH_CHALLENGE data -> the address it was sent to
        self.validated_paths: list[Addr] = []  # addresses whose challenge the peer answered, for the core to take
        # Datagrams over QUIC's minimum lost since one was last acknowledged (data only: probes are not in
        # flight): the path MTU search's sign of a black hole that still carries small datagrams.
        self.big_lost = 0
        loss = self._loss
        lost, acked = loss._on_packets_lost, loss._cc.on_packet_acked

        def on_lost(**kw: Any) -> None:
            kw["packets"] = packets = list(kw["packets"])
            self.big_lost += sum(1 for p in packets if p.in_flight and p.sent_bytes > CHALLENGE_SIZE)
            lost(**kw)

        def on_acked(*, packet: Any, now: float) -> None:
            if packet.sent_bytes > CHALLENGE_SIZE:
                self.big_lost = 0
            acked(packet=packet, now=now)

        loss._on_packets_lost, loss._cc.on_packet_acked = on_lost, on_acked  # type: ignore[method-assign]

    def _one_off(self, size: int, frame: int, capacity: int, payload: bytes, handler: Any, args: tuple,
                 now: float) -> bytes | None:
        """One padded 1-RTT datagram of exactly `size` bytes holding one frame; None before the 1-RTT keys.

        The packet is not counted in flight (its loss is no congestion signal), but it is ack-eliciting, so
        the loss timer covers it.
        """
        crypto = self._cryptos.get(quic_tls.Epoch.ONE_RTT)
        if crypto is None or not crypto.send.is_valid() or not self._handshake_complete or self._version is None:
            return None
        builder = QuicPacketBuilder(host_cid=self.host_cid, is_client=self._is_client, max_datagram_size=size,
                                    packet_number=self._packet_number, peer_cid=self._peer_cid.cid,
                                    version=self._version, spin_bit=self._spin_bit)
        builder.start_packet(QuicPacketType.ONE_RTT, crypto)
        buf = builder.start_frame(frame, capacity=capacity, handler=handler, handler_args=args)
        buf.push_bytes(payload)
        builder._datagram_needs_padding = True  # PADDING frames fill the packet up to `size`
        datagrams, packets = builder.flush()
        if len(datagrams) != 1 or len(datagrams[0]) != size:
            return None  # cannot happen with a valid size; never send a probe of the wrong size
        packet = packets[0]
        packet.in_flight = False
        packet.sent_time = now
        self._packet_number = builder.packet_number
        self._loss.on_packet_sent(packet=packet, space=self._spaces[quic_tls.Epoch.ONE_RTT])
        # what on_packet_sent does for packets in flight: the loss timer counts from the newest ack-eliciting one
        self._loss._time_of_last_sent_ack_eliciting_packet = now
        return datagrams[0]

    def mtu_probe(self, size: int, generation: int, now: float) -> bytes | None:
        """One datagram of exactly `size` bytes: a PING and padding (RFC 9000 §14.4); its acknowledgement or
        loss lands in `mtu_outcomes`. None before the 1-RTT keys exist."""
        return self._one_off(size, QuicFrameType.PING, 1, b"", self._on_mtu_probe, (size, generation), now)

    def _on_mtu_probe(self, delivery: QuicDeliveryState, size: int, generation: int) -> None:
        self.mtu_outcomes.append((size, generation, delivery == QuicDeliveryState.ACKED))

    def path_challenge(self, addr: Addr, now: float) -> bytes | None:
        """A PATH_CHALLENGE (RFC 9000 §8.2) for the caller to send to `addr` itself; once the peer answers it
        (its PATH_RESPONSE may come by any path), `addr` lands in `validated_paths`. None before 1-RTT keys."""
        data = os.urandom(8)
        packet = self._one_off(CHALLENGE_SIZE, QuicFrameType.PATH_CHALLENGE, 9, data, None, (), now)
        if packet is not None:
            self._challenges[data] = addr
            while len(self._challenges) > MAX_CHALLENGES:
                del self._challenges[next(iter(self._challenges))]
        return packet

    def _handle_path_response_frame(self, context: QuicReceiveContext, frame_type: int, buf: Buffer) -> None:
        start = buf.tell()
        addr = self._challenges.pop(buf.pull_bytes(8), None)
        if addr is not None:  # only the peer could read the challenge: it proved itself at addr
            self._challenges.clear()
            self.validated_paths.append(addr)
            return
        buf.seek(start)
        super()._handle_path_response_frame(context, frame_type, buf)

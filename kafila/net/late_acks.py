"""Acknowledgements a link postponed (every second datagram, PinnedQuicConnection.ack_every): sent in time.

A ring edge carries one frame a token one way, so each ACK would be a datagram of its own, built, sent,
read and handled by the two ends in Python. Acknowledging every second one halves that; the other waits
for the next datagram's ACK, or for this timer, armed only while one waits (in steady decoding the next
frame comes first and the timer is cancelled, so it never wakes the loop in the middle of a stage call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kafila.net.quic import ACK_LATE_S, PinnedQuicConnection


class LateAcks:
    """The endpoint's connections that acknowledge every second datagram, and the one timer they share."""

    def __init__(self, send: Callable[[list[PinnedQuicConnection]], None]) -> None:
        self._send = send  # makes the given connections' postponed ACKs go out now
        self._conns: set[PinnedQuicConnection] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, conn: PinnedQuicConnection) -> None:
        conn.ack_every(2)
        self._conns.add(conn)

    def discard(self, conn: PinnedQuicConnection) -> None:
        self._conns.discard(conn)

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def received(self) -> None:
        """After datagrams were handled: a timer while any ACK waits, none once all went out."""
        if not self._conns:
            return
        late = any(conn.ack_postponed for conn in self._conns)
        if late and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(ACK_LATE_S, self._fire)
        elif not late and self._timer is not None:
            self.close()

    def _fire(self) -> None:
        self._timer = None
        self._send([conn for conn in self._conns if conn.ack_postponed])

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

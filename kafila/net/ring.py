"""Ring edges: open exactly this member's two edges and report each as predicted vs as it happened.

The edges are made through the endpoint's own calls (connect, accept, settle_path), which this module
names in `EdgeEndpoint`; PeerEndpoint (kafila.net.endpoint) is one, and offers these as its methods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kafila.errors import NetworkError, SessionError
from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.planner.reachability import predict_edge

log = logging.getLogger("kafila.net")


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
    rtt_ms: float | None = None  # the link's round trip once its path settled (QUIC's smoothed estimate)

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


class EdgeEndpoint(Protocol):
    """What opening ring edges needs from a member's endpoint."""

    member_id: bytes
    me: VerifiedMember | None

    def now(self) -> float: ...
    async def connect(self, peer: VerifiedMember, timeout_s: float = ...) -> Link: ...
    async def accept(self, timeout_s: float = ...) -> Link: ...
    def requeue(self, link: Link) -> None: ...
    async def settle_path(self, peer: VerifiedMember, timeout_s: float | None = ...) -> str: ...
    def direct_since(self, member_id: bytes) -> float | None: ...


async def verify_edge(
    ep: EdgeEndpoint, peer: VerifiedMember, timeout_s: float = 10.0
) -> tuple[Link | None, EdgeReport]:
    """Connect to peer and record predicted vs actual path and the time to a usable link."""
    me = ep.me
    if me is None:
        raise SessionError("announce before verifying edges")
    predicted = predict_edge(me.nat_class, peer.nat_class)
    t0 = ep.now()
    try:
        link = await ep.connect(peer, timeout_s)
    except (NetworkError, SessionError) as exc:
        rep = EdgeReport(me.short_id, peer.short_id, me.nat_class.value, peer.nat_class.value, predicted,
                         "failed", None, None, str(exc))
        return None, rep
    ready_ms = ((link.ready_at or t0) - t0) * 1000.0
    actual = await ep.settle_path(peer)
    direct_at = ep.direct_since(peer.member_id)
    direct_ms = (direct_at - t0) * 1000.0 if actual == "direct" and direct_at else None
    rtt = link.rtt_ms
    rep = EdgeReport(me.short_id, peer.short_id, me.nat_class.value, peer.nat_class.value, predicted, actual,
                     round(ready_ms, 2), None if direct_ms is None else round(max(direct_ms, 0.0), 2),
                     rtt_ms=None if rtt is None else round(rtt, 3))
    log.info("edge %s -> %s: predicted %s, actual %s, ready %.1f ms", rep.src, rep.dst, predicted, actual, ready_ms)
    return link, rep


async def open_ring(ep: EdgeEndpoint, order: Sequence[VerifiedMember], timeout_s: float = 15.0) -> RingEdges:
    """Open exactly this member's two ring edges: connect to the successor, accept the predecessor."""
    if ep.me is None:
        raise SessionError("announce before opening the ring")
    ids = [m.member_id for m in order]
    if ep.member_id not in ids:
        raise SessionError("this member is not in the ring order")
    if len(order) == 1:
        return RingEdges(None, None, None)
    i = ids.index(ep.member_id)
    succ, pred = order[(i + 1) % len(order)], order[(i - 1) % len(order)]

    async def from_pred() -> Link:
        deadline = ep.now() + timeout_s
        stray: list[Link] = []
        try:
            while True:
                link = await ep.accept(max(0.01, deadline - ep.now()))
                if link.peer.member_id == pred.member_id:
                    return link
                stray.append(link)
        finally:
            for s in stray:  # links for someone else's purpose go back in the queue
                ep.requeue(s)

    try:
        async with asyncio.TaskGroup() as tg:
            out_task = tg.create_task(verify_edge(ep, succ, timeout_s))
            in_task = tg.create_task(from_pred())
    except* TimeoutError:
        msg = f"predecessor {pred.name} ({pred.short_id}) did not connect within {timeout_s:.0f} s"
        raise NetworkError(msg)  # noqa: B904 (the group's traceback adds nothing for a person)
    nxt, report = out_task.result()
    return RingEdges(nxt, in_task.result(), report)

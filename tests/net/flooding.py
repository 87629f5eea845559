"""A flood of a real rendezvous from many loopback addresses, run in its own process (tests/net/test_flood*.py):
it reads its replies (it echoes cookies, as an attacker with real addresses can), creates sessions, joins them,
and pings, as fast as one process can; and a new host and member timed opening a session beside it."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import secrets
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from kafila.errors import RendezvousError
from kafila.net import registration, wire
from kafila.net.endpoint import PeerEndpoint
from kafila.net.trust import JoinCode

Addr = tuple[str, int]


@dataclass(frozen=True)
class Flood:
    """Who floods: `ports` sockets on each of `sources`; joins from any address's socket, or (`own_ports`) each
    session joined from two other ports of the address that created it (which once made it a session in use), the
    creating port asking for a new one whenever its address's are all so joined. With a `window`, each socket has
    at most that many requests unanswered (for a second): as fast as the rendezvous answers, without overflowing
    its socket's buffer, whose losses would time a retry, not the table; without one, as fast as it can send."""

    sources: list[str]
    ports: int = 1
    own_ports: bool = False
    seconds: float = 20.0
    window: int | None = None


def run_flood(flood: Flood, rdv: Addr, conn: Connection) -> None:
    """Flood `rdv` for `flood.seconds`, then send its figures (sent, answered, sessions, joins, full) on `conn`."""
    socks = []
    for ip in flood.sources:
        for _ in range(flood.ports):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((ip, 0))
            s.setblocking(False)
            socks.append(s)
    code = JoinCode("00000000", JoinCode.new_secret())  # the flood knows its own sessions' code
    cookies: dict[int, str] = {}
    sessions: list[str] = []
    by_address: dict[int, list[str]] = {a: [] for a in range(len(flood.sources))}  # sessions each address made
    joined: list[tuple[int, str, str]] = []  # (socket, session, member) registered
    asked: dict[tuple[int, int], tuple[str, dict[str, object]]] = {}
    sent = answered = full = 0
    end = time.monotonic() + flood.seconds
    rid = 0
    unanswered = [0] * len(socks)  # requests each socket sent since its last reply (bounded by the window)
    heard = [0.0] * len(socks)  # when each socket last had a reply, or gave up waiting for one

    def send(i: int, body: dict[str, object]) -> None:
        nonlocal rid, sent
        rid += 1
        asked[(i, rid)] = (str(body["op"]), body)
        try:
            socks[i].sendto(wire.encode_control(wire.REQUEST, rid, body), rdv)
            sent += 1
            unanswered[i] += 1
        except BlockingIOError:
            pass

    def held_back(i: int, now: float) -> bool:
        if flood.window is None or unanswered[i] < flood.window:
            return False
        if now - heard[i] < 1.0:
            return True
        unanswered[i], heard[i] = 0, now  # a second without a reply: what it waited for was lost
        return False

    pinned_by: dict[str, set[int]] = {}  # own_ports: the sockets each session was joined from

    def to_join(i: int) -> str | None:
        """The session socket i joins now: one of its address's own that two ports have not joined, or anyone's."""
        if not flood.own_ports:
            return sessions[(i + rid) % len(sessions)] if sessions else None
        if i % flood.ports == 0:
            return None  # the creating port
        own = by_address[i // flood.ports]
        return next((sid for sid in own if len(pinned_by[sid]) < 2 and i not in pinned_by[sid]), None)

    def to_create(i: int) -> bool:
        if not flood.own_ports:
            return True
        own = by_address[i // flood.ports]
        return i % flood.ports == 0 and all(len(pinned_by[sid]) >= 2 for sid in own)

    while (now := time.monotonic()) < end:
        for i in range(len(socks)):
            if held_back(i, now):
                continue
            if i not in cookies:
                send(i, registration.cookie_body())
                continue
            if to_create(i):
                send(i, {"op": "create", "join_pub": code.join_public.hex(), "cookie": cookies[i]})
            sid = to_join(i)
            if sid is not None:  # joined from a second address, or port, of ours: it counted as in use
                mid = secrets.token_bytes(wire.ID_LEN)
                proof = JoinCode(sid, code.secret).join_proof(mid, bytes.fromhex(cookies[i]))
                send(i, {**registration.join_body(sid, mid, proof), "cookie": cookies[i]})
            for _, sid, mid in joined[-4:]:
                send(i, {"op": "ping", "session": sid, "member": mid})
        for i, s in enumerate(socks):
            while True:
                try:
                    data, _ = s.recvfrom(2048)
                except BlockingIOError:
                    break
                frame = wire.decode(data)
                answered += 1
                unanswered[i], heard[i] = max(0, unanswered[i] - 1), now
                op, body = asked.pop((i, frame.request_id), ("", {}))
                if frame.body.get("ok") is True and op == "create":
                    sessions.append(str(frame.body["session"]))
                    by_address[i // flood.ports].append(sessions[-1])
                    pinned_by[sessions[-1]] = set()
                elif frame.body.get("ok") is True and op == "cookie":
                    cookies[i] = str(frame.body["cookie"])
                elif frame.body.get("ok") is True and op == "join":
                    joined.append((i, str(body["session"]), str(body["member"])))
                    pinned_by.setdefault(str(body["session"]), set()).add(i)
                elif frame.body.get("code") == "cookie":
                    cookies.pop(i, None)
                elif frame.body.get("code") == "full":
                    full += 1
                elif frame.body.get("code") == "unknown_session" and op == "join":  # dropped for room
                    own = by_address[i // flood.ports]
                    if body["session"] in own:
                        own.remove(str(body["session"]))
        if len(asked) > 100_000:
            asked.clear()
    conn.send({"sent": sent, "answered": answered, "sessions": len(sessions), "joins": len(joined), "full": full})


def start_flood(flood: Flood, rdv: Addr) -> tuple[mp.process.BaseProcess, Connection]:
    """The flood in a process of its own (spawned: one process's worth of sending), and the end its figures come to."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    flooder = ctx.Process(target=run_flood, args=(flood, rdv, theirs), daemon=True)
    flooder.start()
    return flooder, ours


def end_flood(flooder: mp.process.BaseProcess, figures: Connection, flood: Flood) -> dict[str, Any]:
    """The flood's figures, once it has finished; the process is gone after this, killed if need be."""
    try:
        assert figures.poll(flood.seconds + 30), "the flood did not report"
        return dict(figures.recv())
    finally:
        flooder.join(10)
        if flooder.is_alive():
            flooder.kill()


async def new_host_and_member(rdv: Addr, host_ip: str, member_ip: str,
                              member_after_s: float = 0.0) -> tuple[float, float]:
    """A new host opens a session from host_ip and, `member_after_s` later, a member joins it from member_ip: the
    seconds the host's took, and the member's; AssertionError naming the refusal when the rendezvous refuses either."""
    t0 = time.monotonic()
    async with PeerEndpoint(bind=(host_ip, 0), name="host") as host, \
            PeerEndpoint(bind=(member_ip, 0), name="member") as member:
        try:
            code = await host.create_session(rdv)
        except RendezvousError as exc:
            took = time.monotonic() - t0
            raise AssertionError(f"the new host was refused after {took:.2f} s: {exc.code}: {exc}") from None
        created = time.monotonic() - t0
        await asyncio.sleep(member_after_s)
        t0 = time.monotonic()
        try:
            await member.join_session(rdv, str(code))
        except RendezvousError as exc:
            took = time.monotonic() - t0
            raise AssertionError(f"the member was refused after {took:.2f} s: {exc.code}: {exc}") from None
        return created, time.monotonic() - t0

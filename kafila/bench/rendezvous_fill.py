"""Filling a real RendezvousCore in-process as members' clients do, and measuring what its table holds.

No sockets: datagrams go straight to `RendezvousCore.handle`, every op as a member sends it (a padded cookie
request, create, a join signed for its cookie, an announce MAC'd with the registration key). Each session is
joined by 16 members from two sites (an IPv4 /24 each), so it is in use and never dropped for room: a full
table refuses, and the fill stops there. Each session has a /24 of its own, 256 sessions to a /16, so the
per-network and per-block caps never stop it.
"""

from __future__ import annotations

import gc
import itertools
import os
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafila.bench.proc_mem import status_kb
from kafila.errors import ProtocolError
from kafila.net import registration, wire
from kafila.net.trust import JoinCode
from rendezvous.core import Addr, Limits, RendezvousCore
from rendezvous.state import MAX_SPENT_GUESSES, MEMBER_BYTES, announcement_bytes

LOCAL: Addr = ("192.0.2.1", 3478)  # the rendezvous's socket
SECRET = "4f8tzr2w9mhcqp3a"  # the join code's secret: any will do, the rendezvous never sees it
MEMBERS = 16  # Limits().max_members: a session as full as the rendezvous lets it be
Progress = Callable[[int, int], None]  # (table bytes counted, sessions)


def creator_ip(i: int) -> str:
    """Session i's host: a /24 of its own, 256 sessions to a /16 (10.0.0.0 on, 100,000 sessions in 10-11.x)."""
    block = i // 256
    return f"{10 + block // 256}.{block % 256}.{i % 256}.1"


def member_addr(i: int, k: int) -> Addr:
    """Member k of session i: half from the host's /24 (member 0 is the host), half from a second site."""
    a, b, c, _ = creator_ip(i).split(".")
    first = int(a) + (100 if k >= MEMBERS // 2 else 0)
    return (f"{first}.{b}.{c}.{1 + k}", 4000)


class Client:
    """Asks a RendezvousCore as members' clients do, every request numbered; `now` stays put, so no member
    goes silent and every cookie stays good."""

    def __init__(self, core: RendezvousCore, now: float = 0.0) -> None:
        self.core, self.now = core, now
        self._rid = itertools.count(1)
        self.join_pub = JoinCode("00000000", SECRET).join_public

    def ask(self, body: dict[str, Any], src: Addr) -> dict[str, Any]:
        """The reply's body; {"ok": False, "code": "silent"} when the rendezvous did not answer."""
        rid = next(self._rid) & 0xFFFFFFFF
        out = self.core.handle(wire.encode_control(wire.REQUEST, rid, body), src, LOCAL, self.now)
        if not out:
            return {"ok": False, "code": "silent"}
        frame = wire.decode(out[0][0])
        if not isinstance(frame, wire.Control):
            raise ProtocolError("the rendezvous answered with something other than a control reply")
        return frame.body

    def cookie(self, src: Addr) -> bytes:
        """The cookie for `src`, asked for first as a member does (its request padded to the answer's size)."""
        reply = self.ask({"op": "cookie", "pad": "p" * registration.COOKIE_PAD}, src)
        return wire.get_hex(reply, "cookie", registration.COOKIE_LEN)


@dataclass
class Filler:
    """Makes sessions of 16 members announcing `ann`; with `spent`, each member also spends the re-join nonces
    its record keeps at most (wrong MACs), the largest a member's record gets."""

    core: RendezvousCore
    ann: str
    spent: bool = False
    refused: str | None = None  # the code of the refusal that stopped the fill
    members: int = 0
    client: Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = Client(self.core)

    def session(self, i: int) -> bool:
        """Session i made, joined and announced by all its members; False once the rendezvous refuses."""
        c, host = self.client, member_addr(i, 0)
        made = c.ask({"op": "create", "join_pub": c.join_pub.hex(), "cookie": c.cookie(host).hex()}, host)
        if not self._ok(made):
            return False
        sid = str(made["session"])
        code = JoinCode(sid, SECRET)
        for k in range(MEMBERS):
            src, mid = member_addr(i, k), i.to_bytes(6, "big") + bytes([k, 0])
            cookie = c.cookie(src)
            joined = c.ask({**registration.join_body(sid, mid, code.join_proof(mid, cookie)), "cookie": cookie.hex()},
                           src)
            if not self._ok(joined):
                return False
            self.members += 1
            key = registration.reg_key_of(joined)
            body = {"op": "announce", "session": sid, "member": mid.hex(), "ann": self.ann}
            if not self._ok(c.ask(registration.signed(body, key, 1), src)):
                return False
            if self.spent:
                self._spend(sid, mid, src, cookie)
        return True

    def _spend(self, sid: str, mid: bytes, src: Addr, cookie: bytes) -> None:
        """Member `mid` spends the re-join nonces its record keeps at most, each on a wrong MAC."""
        c, spent = self.client, 0
        while spent < MAX_SPENT_GUESSES:
            nonce = wire.get_hex(c.ask(registration.challenge_body(sid, mid), src), "nonce", registration.NONCE_LEN)
            wrong = registration.rejoin_body(sid, mid, bytes(registration.REG_KEY_LEN), nonce)
            code = c.ask({**wrong, "cookie": cookie.hex()}, src).get("code")
            # with `now` standing still, two nonces differ only by their 2 bytes of salt: one may repeat
            if code not in ("bad_mac", "stale_nonce"):
                raise ProtocolError(f"a wrong re-join MAC was refused as {code!r}, not as a wrong MAC")
            spent += code == "bad_mac"

    def _ok(self, reply: dict[str, Any]) -> bool:
        if reply.get("ok"):
            return True
        if reply.get("code") != "full":  # rate-limited or refused otherwise: the bench's own fault
            raise ProtocolError(f"the rendezvous refused the fill: {reply}")
        self.refused = "full"
        return False

    def bound(self) -> str:
        """Which limit stopped the fill: "sessions", "bytes" (what one more member would add), or "other"."""
        lim, table = self.core.limits, self.core.table
        if len(table.sessions) >= lim.max_sessions:
            return "sessions"
        if table.size + MEMBER_BYTES + announcement_bytes(self.ann) > lim.max_table_bytes:
            return "bytes"
        return "other"


def largest_announcement(limits: Limits | None = None) -> int:
    """The longest announcement (characters) the rendezvous stores: found by asking a real core, as a member
    that holds the code could send any (a real member's sealed one is at most 1,240)."""
    filler = Filler(RendezvousCore([LOCAL], limits), "")
    c, host, mid = filler.client, member_addr(0, 0), b"\1" * 8
    sid = str(c.ask({"op": "create", "join_pub": c.join_pub.hex(), "cookie": c.cookie(host).hex()}, host)["session"])
    cookie = c.cookie(host)
    joined = c.ask({**registration.join_body(sid, mid, JoinCode(sid, SECRET).join_proof(mid, cookie)),
                    "cookie": cookie.hex()}, host)
    key, n = registration.reg_key_of(joined), itertools.count(1)
    lo, hi = 0, filler.core.limits.max_datagram  # accepted: lo; refused: hi (the datagram alone is too large)
    while hi - lo > 1:
        mid_len = (lo + hi) // 2
        body = {"op": "announce", "session": sid, "member": mid.hex(), "ann": "Q" * mid_len}
        try:
            ok = bool(c.ask(registration.signed(body, key, next(n)), host).get("ok"))
        except ProtocolError:  # larger than a control message may be: no client can send it
            ok = False
        if ok:
            lo = mid_len
        else:
            hi = mid_len
    return lo


def rss_kb(key: str = "VmRSS") -> int:
    """This process's VmRSS (or VmHWM, its peak) in kB; 0 where /proc has none."""
    return status_kb(os.getpid(), key) or 0


def measure_sample(limits: Limits, ann: str, warmup: int, sessions: int, spent: bool = False) -> dict[str, Any]:
    """Bytes per session by tracemalloc: the `sessions` made after `warmup` (which fill the reply cache and
    rate-limit buckets to their bounds, as on a busy rendezvous), beside what the table counts for them."""
    gc.collect()
    tracemalloc.start()  # before the warm-up: what it allocates and later frees is then taken off
    try:
        filler = Filler(RendezvousCore([LOCAL], limits), ann, spent)
        made = sum(filler.session(i) for i in range(warmup))
        gc.collect()
        held0, counted0 = tracemalloc.get_traced_memory()[0], filler.core.table.size
        made_after = sum(filler.session(i) for i in range(warmup, warmup + sessions))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - held0
    finally:
        tracemalloc.stop()
    counted = filler.core.table.size - counted0
    if made != warmup or made_after != sessions:
        raise ProtocolError(f"the sample did not fit: {made}+{made_after} sessions made (raise the limits)")
    return {"sessions": sessions, "warmup_sessions": warmup, "held_bytes_per_session": held / sessions,
            "counted_bytes_per_session": counted / sessions, "held_over_counted": held / counted}


def fill_table(limits: Limits, ann: str, spent: bool = False, progress: Progress | None = None,
               every: int = 64) -> dict[str, Any]:
    """Sessions made until the table at `limits` refuses more: how many, what it counts, and this process's RSS
    before, after and at its peak (VmHWM), `progress` told every `every` sessions."""
    gc.collect()
    rss0, t0 = rss_kb(), time.perf_counter()
    filler = Filler(RendezvousCore([LOCAL], limits), ann, spent)
    i = 0
    while filler.session(i):
        i += 1
        if progress is not None and i % every == 0:
            progress(filler.core.table.size, len(filler.core.sessions))
    seconds = time.perf_counter() - t0
    gc.collect()
    table = filler.core.table
    n = len(table.sessions)
    rss = rss_kb()
    if progress is not None:
        progress(table.size, n)
    return {"sessions": n, "members": filler.members, "bound": filler.bound(), "refused": filler.refused,
            "table_bytes": table.size, "counted_bytes_per_session": table.size / n, "rss_before_kb": rss0,
            "rss_kb": rss, "peak_rss_kb": rss_kb("VmHWM"), "rss_bytes_per_session": (rss - rss0) * 1024 / n,
            "seconds": seconds}

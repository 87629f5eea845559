"""An emulated NAT lab: Linux network namespaces + nftables (reference/natlab.md), reusable by tests and bench.

Topology (every address exists only inside namespaces this module creates, named with a unique
prefix so two runs never collide):

    h1 10.1.0.2 --lan 10.1.0.1 [nat1] wan 100.64.0.11 --\\
                                                         br0 in <prefix>pub: 100.64.0.2 + 100.64.0.3 (rendezvous)
    h2 10.2.0.2 --lan 10.2.0.1 [nat2] wan 100.64.0.12 --/

Routers have no route to the other LAN, so h1<->h2 traffic can only cross both NATs. Each router
gets one of three rule sets (permissive = full cone via a dynamic port map, ordinary = plain
masquerade, restrictive = masquerade random), always with the WAN input-drop chain without which
"ordinary" measures as restrictive. Rules can be reloaded between runs (`set_nat`), and conntrack
is flushed so no stale mapping carries over.

NatLab(nats=N) builds N such NAT+host pairs (WAN 100.64.0.(10+i), LAN 10.i.0.0/24) for a whole
session. Use:

    with NatLab(nats=3) as lab:
        lab.set_nat(1, NatClass.ORDINARY)                       # and 2, 3 ...
        rdv = await start_rendezvous(lab)                       # kafila rendezvous on RDV_IP/RDV_ALT_IP
        p = await asyncio.create_subprocess_exec(*lab.command(lab.host(1), argv), ...)
        lab.track(p)                                            # killed before the namespaces go

`python -m kafila.lab.natlab member ...` is the member program the pair runner starts.
Needs root (CAP_NET_ADMIN) and the `nft` binary; `available()` says why not when it cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kafila.planner.reachability import NatClass, predict_edge

log = logging.getLogger("kafila.natlab")

REPO = Path(__file__).resolve().parents[2]
RDV_IP, RDV_ALT_IP, RDV_PORT = "100.64.0.2", "100.64.0.3", 3478

_FILTER = """
  chain input {
    type filter hook input priority filter; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" meta l4proto icmp accept
    iifname "wan" drop
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    iifname "lan" oifname "wan" accept
    iifname "wan" ct state established,related accept
    iifname "wan" ct status dnat accept
  }
"""
RULES: dict[NatClass, str] = {
    NatClass.ORDINARY: """flush ruleset
table ip natlab {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" masquerade
  }
""" + _FILTER + "}\n",
    NatClass.RESTRICTIVE: """flush ruleset
table ip natlab {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" masquerade random
  }
""" + _FILTER + "}\n",
    NatClass.PERMISSIVE: """flush ruleset
table ip natlab {
  map fullcone {
    type inet_service : ipv4_addr . inet_service
    flags dynamic,timeout
    timeout 120s
    size 65535
  }
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "wan" meta l4proto udp dnat ip to udp dport map @fullcone
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" masquerade
  }
  chain record {
    type filter hook postrouting priority srcnat + 1; policy accept;
    oifname "wan" meta l4proto udp ct direction original \
      update @fullcone { udp sport : ct original ip saddr . ct original proto-src }
  }
""" + _FILTER + "}\n",
}


def available() -> str | None:
    """None when the lab can run here, else why not."""
    if os.geteuid() != 0:
        return "the NAT lab needs root (network namespaces and nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"the NAT lab needs the `{tool}` binary (apt-get install nftables iproute2)"
    return None


def _run(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return res


class NatLab:
    """The namespaces, links and routers; a context manager that always tears everything down."""

    def __init__(self, prefix: str | None = None, nats: int = 2) -> None:
        if not 1 <= nats <= 50:
            raise ValueError("1 to 50 NATs")
        self.nats = nats  # NAT i (1-based) has WAN 100.64.0.(10+i) and one host 10.i.0.2 behind it
        self.prefix = prefix or f"kl{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.pub = f"{self.prefix}pub"
        self._made: list[str] = []
        self._procs: list[subprocess.Popen[str] | asyncio.subprocess.Process] = []
        self.has_conntrack = shutil.which("conntrack") is not None
        self.workdir = Path(tempfile.gettempdir()) / f"{self.prefix}-lab"  # made in __enter__

    def router(self, i: int) -> str:
        """The namespace of NAT i (1 or 2)."""
        return f"{self.prefix}n{i}"

    def host(self, i: int) -> str:
        """The namespace of the host behind NAT i."""
        return f"{self.prefix}h{i}"

    def _ns(self, ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", ns, *cmd, check=check)

    def __enter__(self) -> NatLab:
        why = available()
        if why:
            raise RuntimeError(why)
        try:
            self.workdir.mkdir(mode=0o700)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        t0 = time.monotonic()
        names = [self.pub] + [self.router(i) for i in range(1, self.nats + 1)]
        for ns in names + [self.host(i) for i in range(1, self.nats + 1)]:
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            self._ns(ns, "ip", "link", "set", "lo", "up")
        pub = self.pub
        self._ns(pub, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(pub, "ip", "addr", "add", f"{RDV_IP}/24", "dev", "br0")
        self._ns(pub, "ip", "addr", "add", f"{RDV_ALT_IP}/24", "dev", "br0")
        self._ns(pub, "ip", "link", "set", "br0", "up")
        for i in range(1, self.nats + 1):
            r, h = self.router(i), self.host(i)
            _run("ip", "link", "add", "wan", "netns", r, "type", "veth", "peer", "name", f"p{i}", "netns", pub)
            self._ns(pub, "ip", "link", "set", f"p{i}", "master", "br0")
            self._ns(pub, "ip", "link", "set", f"p{i}", "up")
            self._ns(r, "ip", "addr", "add", f"100.64.0.{10 + i}/24", "dev", "wan")
            self._ns(r, "ip", "link", "set", "wan", "up")
            _run("ip", "link", "add", "lan", "netns", r, "type", "veth", "peer", "name", "eth0", "netns", h)
            self._ns(r, "ip", "addr", "add", f"10.{i}.0.1/24", "dev", "lan")
            self._ns(r, "ip", "link", "set", "lan", "up")
            self._ns(r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self._ns(h, "ip", "addr", "add", f"10.{i}.0.2/24", "dev", "eth0")
            self._ns(h, "ip", "link", "set", "eth0", "up")
            self._ns(h, "ip", "route", "add", "default", "via", f"10.{i}.0.1")
        log.info("NAT lab %s built in %.2f s", self.prefix, time.monotonic() - t0)

    def set_nat(self, i: int, cls: NatClass) -> None:
        """Load the rule set for `cls` on NAT i and flush its connection tracking."""
        _run("ip", "netns", "exec", self.router(i), "nft", "-f", "-", input=RULES[NatClass(cls)])
        if self.has_conntrack:
            self._ns(self.router(i), "conntrack", "-F", check=False)

    def command(self, ns: str, argv: list[str]) -> list[str]:
        """argv run inside namespace ns."""
        return ["ip", "netns", "exec", ns, *argv]

    def track(self, proc: subprocess.Popen[str] | asyncio.subprocess.Process) -> None:
        """Remember a process to stop (by its pid) before the namespaces go."""
        self._procs.append(proc)

    def close(self) -> None:
        """Stop tracked processes, then delete the namespaces (a live process would keep one alive)."""
        for p in self._procs:
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self._procs:
            if isinstance(p, subprocess.Popen):
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._procs.clear()
        for ns in reversed(self._made):
            _run("ip", "netns", "del", ns, check=False)
        self._made.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


# ---- running one pair of members -------------------------------------------------------


@dataclass(frozen=True)
class PairResult:
    """One ordered class pair: what each side measured, predicted vs verified, and timings."""

    a: str  # emulated class of NAT 1 (the member that opens the edge)
    b: str  # emulated class of NAT 2
    a_measured: str
    b_measured: str
    predicted: str
    verified: str  # "direct" | "relay" | "failed"
    ready_ms: float | None
    direct_ms: float | None
    echo_ok: bool
    error: str | None = None
    rtt_ms: float | None = None  # the edge's round trip as its QUIC link measured it

    @property
    def classified_ok(self) -> bool:
        """Both members measured the class their NAT emulates."""
        return self.a_measured == self.a and self.b_measured == self.b


async def _read_json(stream: asyncio.StreamReader, key: str, timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {key!r} line within {timeout_s} s")
        line = await asyncio.wait_for(stream.readline(), left)
        if not line:
            raise EOFError(f"process ended before printing {key!r}")
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and key in d:
            return d


def _member_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "kafila.lab.natlab", "member", "--rdv", f"{RDV_IP}:{RDV_PORT}", *args]


async def start_rendezvous(lab: NatLab, timeout_s: float = 15.0) -> asyncio.subprocess.Process:
    """`kafila rendezvous` inside the public namespace, on both addresses; waits until it listens."""
    argv = [sys.executable, str(REPO / "kafila.py"), "rendezvous", "--host", RDV_IP, "--port", str(RDV_PORT),
            "--alt-ip", RDV_ALT_IP]
    log_path = lab.workdir / "rendezvous.log"  # kept until the lab closes: useful when a pair fails
    with open(log_path, "ab") as log_file:
        proc = await asyncio.create_subprocess_exec(*lab.command(lab.pub, argv), cwd=REPO,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=log_file)
    lab.track(proc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if b"listening" in log_path.read_bytes():
            return proc
        if proc.returncode is not None:
            raise RuntimeError(f"the rendezvous exited at start: {log_path.read_text()[-500:]}")
        await asyncio.sleep(0.02)
    raise TimeoutError("the rendezvous did not start listening")


async def run_pair(lab: NatLab, a: NatClass, b: NatClass, timeout_s: float = 25.0,
                   delay_ms: float = 0.0) -> PairResult:
    """Emulate classes a on NAT 1 and b on NAT 2, start one member behind each, open the edge 1 -> 2.

    `delay_ms`: EMULATION, each member holds every datagram it sends this long (`--link-delay`), so the
    edge is a WAN's."""
    lab.set_nat(1, a)
    lab.set_nat(2, b)
    from kafila.net.trust import JoinCode

    secret = JoinCode.new_secret()
    procs: list[asyncio.subprocess.Process] = []

    async def spawn(i: int, *args: str) -> asyncio.subprocess.Process:
        err = None if os.environ.get("KAFILA_LAB_DEBUG") else asyncio.subprocess.DEVNULL  # debug: member logs shown
        argv = _member_argv(*args, "--link-delay", str(delay_ms))
        p = await asyncio.create_subprocess_exec(*lab.command(lab.host(i), argv), cwd=REPO,
                                                 stdout=asyncio.subprocess.PIPE, stderr=err)
        lab.track(p)
        procs.append(p)
        return p

    try:
        pa = await spawn(1, "--role", "open", "--secret", secret)
        assert pa.stdout is not None
        code = (await _read_json(pa.stdout, "code", timeout_s))["code"]
        pb = await spawn(2, "--role", "accept", "--code", str(code))
        assert pb.stdout is not None
        ra, rb = await asyncio.gather(_read_json(pa.stdout, "result", timeout_s),
                                      _read_json(pb.stdout, "result", timeout_s))
    except (TimeoutError, EOFError) as exc:
        return PairResult(a.value, b.value, "?", "?", predict_edge(a, b), "failed", None, None, False, str(exc))
    finally:
        for p in procs:
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
            await asyncio.wait_for(p.wait(), 5)
    am, bm = str(ra.get("nat")), str(rb.get("nat"))
    predicted = predict_edge(NatClass(am), NatClass(bm)) if "?" not in (am, bm) else "relay"
    ready, direct, rtt = ra.get("ready_ms"), ra.get("direct_ms"), ra.get("rtt_ms")
    return PairResult(
        a.value, b.value, am, bm, predicted, str(ra.get("actual", "failed")),
        float(ready) if isinstance(ready, (int, float)) else None,
        float(direct) if isinstance(direct, (int, float)) else None,
        bool(ra.get("echo_ok")) and bool(rb.get("echo_ok")),
        ra.get("error") or rb.get("error"),  # type: ignore[arg-type]
        float(rtt) if isinstance(rtt, (int, float)) else None,
    )


CLASSES = (NatClass.PERMISSIVE, NatClass.ORDINARY, NatClass.RESTRICTIVE)


async def run_all_pairs(lab: NatLab, delay_ms: float = 0.0) -> list[PairResult]:
    """All 9 ordered class pairs, one after the other, in one lab and with one rendezvous."""
    rdv = await start_rendezvous(lab)
    try:
        return [await run_pair(lab, a, b, delay_ms=delay_ms) for a in CLASSES for b in CLASSES]
    finally:
        rdv.kill()
        await asyncio.wait_for(rdv.wait(), 5)


# ---- the member program (runs inside a host namespace) ----------------------------------


async def _member(args: argparse.Namespace) -> dict[str, object]:
    from kafila.errors import KafilaError
    from kafila.net.endpoint import PeerEndpoint
    from kafila.net.punch import PunchConfig

    if os.environ.get("KAFILA_LAB_DEBUG"):
        def dump() -> None:
            for t in asyncio.all_tasks():
                t.print_stack(file=sys.stderr)
        asyncio.get_running_loop().call_later(12, dump)
    host, port = args.rdv.rsplit(":", 1)
    rdv = (host, int(port))
    out: dict[str, object] = {}
    async with PeerEndpoint(name=args.role, punch=PunchConfig(window_s=args.punch_window),
                            link_delay_s=args.link_delay / 1e3) as ep:
        try:
            report = await ep.probe_nat(rdv)
            out["nat"] = report.nat_class.value
            out["evidence"] = report.summary()
            if args.role == "open":
                code = await ep.create_session(rdv, secret=args.secret)
                print(json.dumps({"code": str(code)}), flush=True)
            else:
                await ep.join_session(rdv, args.code)
            await ep.announce({"role": args.role})
            ml = await ep.wait_for_members(2, timeout_s=15)
            peer = next(m for m in ml.verified if m.member_id != ep.member_id)
            if args.role == "open":
                link, rep = await ep.verify_edge(peer)
                out.update(asdict(rep))
                if link is not None:
                    await link.send(b"marco")
                    out["echo_ok"] = await link.recv(timeout=5) == b"polo"
                    await link.send(b"bye")
                    await asyncio.sleep(0.1)
            else:
                link = await ep.accept(timeout_s=15)
                msg = await link.recv(timeout=15)
                await link.send(b"polo" if msg == b"marco" else b"?")
                out["echo_ok"] = msg == b"marco"
                await link.recv(timeout=10)
        except (KafilaError, TimeoutError, StopIteration) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m kafila.lab.natlab member ...`."""
    p = argparse.ArgumentParser(prog="kafila.lab.natlab")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("member", help="one lab member (run inside a host namespace)")
    m.add_argument("--rdv", required=True)
    m.add_argument("--role", choices=["open", "accept"], required=True)
    m.add_argument("--secret", default=None)
    m.add_argument("--code", default=None)
    m.add_argument("--punch-window", type=float, default=2.0)
    m.add_argument("--link-delay", type=float, default=0.0, help="EMULATION: ms each datagram sent is held")
    args = p.parse_args(argv)
    debug = bool(os.environ.get("KAFILA_LAB_DEBUG"))
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, stream=sys.stderr)
    if os.environ.get("KAFILA_LAB_DEBUG"):
        import faulthandler

        faulthandler.dump_traceback_later(20, exit=True)
    result = asyncio.run(asyncio.wait_for(_member(args), 40))
    print(json.dumps({"result": True, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

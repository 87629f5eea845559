"""One real side of a session in this process, its counterparts scripted over real links.

Everything on the wire is real: an in-process rendezvous (RendezvousServer on 127.0.0.1), a PeerEndpoint
per party, QUIC links over UDP between them, and the session's own control messages. What is scripted is
the other side's behaviour, so that a test can reach one path of the coordinator or of a member at once:

- `coordinator(...)`: the real coordinator (HostRuntime) of a session whose members are `ScriptedMember`s:
  each answers an assignment at once (it holds its stage: `need` nothing, `loaded`) and its `connect` as
  the test says (`ready` by default).
- `member(...)`: a real member (MemberRuntime) whose coordinator is the test (`ScriptedHost`), beside
  other endpoints of the session that the test drives (or leaves silent); `host_stage` and `assign` give it
  a real stage to receive (cut from the embedded SmolLM2).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from kafila.engine.build import build_identity, build_tag
from kafila.errors import NetworkError
from kafila.model.cut import StageSpec
from kafila.model.describe import describe_model
from kafila.model.embedded import default_model_path
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.quic import Identity, Link
from kafila.session.coordinator.runtime import HostRuntime
from kafila.session.coordinator.session import open_session
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.delivery.local_model import model_proof
from kafila.session.delivery.stage_files import manifest_for
from kafila.session.member.host_link import connect_host
from kafila.session.member.runtime import MemberRuntime
from kafila.session.options import HostOptions, MemberOptions
from kafila.session.protocol import chunks, messages
from kafila.session.protocol.announcement import wire_protocol
from kafila.session.protocol.manifest import StageManifest
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState
from tests.rendezvous.inprocess import loopback_rendezvous

LOOPBACK = ("127.0.0.1", 0)
WAIT_S = 60.0  # a bound on a hang, not a speed check: every wait here is on an event
C = TypeVar("C", bound=messages.Control)


def member_measurements() -> dict[str, Any]:
    """A member's announcement as `kafila join` makes it, with fixed numbers in place of a probe's."""
    return {"role": "member", "bw": 1e10, "ubw": 1e10, "disp": 1e-4, "mem": 8 << 30,
            "build": build_tag(build_identity()), "proto": wire_protocol()}


async def endpoint(stack: AsyncExitStack, rdv: tuple[str, int], name: str, code: str | None,
                   announce: dict[str, Any], identity: Identity | None = None) -> tuple[PeerEndpoint, str]:
    """A PeerEndpoint on loopback that joined the session `code` and announced itself (with the certificate
    `identity`, when given: a second endpoint of one member); or, `code` None, the host's: it opened the
    session as its coordinator (`announce` unused)."""
    ep = await stack.enter_async_context(PeerEndpoint(bind=LOOPBACK, identity=identity, name=name,
                                                      idle_timeout_s=5.0))
    await ep.probe_nat(rdv)
    if code is None:
        return ep, str((await open_session(ep, rdv))[0])
    await ep.join_session(rdv, code)
    await ep.announce(announce)
    return ep, code


def silence(ep: PeerEndpoint) -> None:
    """Leave `ep` to its peers as `kill -9` leaves a process's: it neither reads nor sends another datagram."""
    assert ep._socket is not None
    ep._socket.close()


class Inbox:
    """Every control message a link brought, in order, read by a task; waiters wake on each one."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.got: list[messages.Control] = []
        self.chunks: list[int] = []  # the indices of the stage chunks that came
        self.closed: str | None = None
        self._changed = asyncio.Condition()
        self.on_message: Callable[[messages.Control], Awaitable[None]] | None = None

    async def read(self) -> None:
        try:
            while True:
                raw = await self.link.recv()
                if messages.kind(raw) == "chunk":
                    self.chunks.append(chunks.parse_chunk(raw)[0])
                if messages.kind(raw) != "control":
                    continue
                msg = messages.decode(raw)
                async with self._changed:
                    self.got.append(msg)
                    self._changed.notify_all()
                if self.on_message is not None:
                    await self.on_message(msg)
        except NetworkError as exc:
            async with self._changed:
                self.closed = str(exc)
                self._changed.notify_all()

    async def first(self, kind: type[C], where: Callable[[C], bool] = lambda m: True, after: int = 0) -> C:
        """The first message of `kind` (from the `after`-th on) that `where` accepts, once it has come."""
        def found() -> C | None:
            return next((m for m in self.got[after:] if isinstance(m, kind) and where(m)), None)

        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(lambda: found() is not None or self.closed is not None)
        msg = found()
        assert msg is not None, f"the link closed ({self.closed}) before a {kind.T!r} came: {self.got}"
        return msg

    async def until_closed(self) -> str:
        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(lambda: self.closed is not None)
        assert self.closed is not None
        return self.closed

    def of(self, kind: type[C]) -> list[C]:
        return [m for m in self.got if isinstance(m, kind)]


OnConnect = Callable[["ScriptedMember", messages.Connect], Awaitable[None]]
OnAssign = Callable[["ScriptedMember", messages.Assign], Awaitable[None]]


@dataclass
class ScriptedMember:
    """A member of the coordinator's session that answers on the wire as the test says."""

    name: str
    ep: PeerEndpoint
    inbox: Inbox
    on_connect: OnConnect | None = None  # None: `ready` at once
    on_assign: OnAssign | None = None  # None: it holds the stage already, `loaded` at once
    model: Path | None = None  # the file it proves it holds when asked (None: it answers a made-up proof)
    assignments: dict[int, messages.Assign] = field(default_factory=dict)

    async def send(self, msg: messages.Control) -> None:
        await self.inbox.link.send(messages.encode(msg))

    def order(self, epoch: int) -> tuple[str, ...]:
        return self.assignments[epoch].order

    def predecessor(self, epoch: int) -> str:
        order = self.order(epoch)
        return order[order.index(self.name) - 1]

    async def answer(self, msg: messages.Control) -> None:
        if isinstance(msg, messages.Assign) and self.on_assign is not None:
            self.assignments[msg.epoch] = msg
            await self.on_assign(self, msg)
        elif isinstance(msg, messages.Assign):  # it holds its stage already: nothing to send, loaded at once
            self.assignments[msg.epoch] = msg
            await self.send(messages.Need(msg.epoch, ()))
            await self.send(messages.Loaded(msg.epoch))
        elif isinstance(msg, messages.Prove):
            digest = model_proof(self.model, bytes.fromhex(msg.nonce)) if self.model else "0" * 64
            await self.send(messages.Proof(digest))
        elif isinstance(msg, messages.Connect):
            if self.on_connect is None:
                await self.send(messages.Ready(msg.epoch, None))
            else:
                await self.on_connect(self, msg)


@dataclass
class Coordinated:
    runtime: HostRuntime
    state: SessionState
    members: dict[str, ScriptedMember]
    run: asyncio.Task[int]

    async def reach(self, phase: str, after_epoch: int = 0) -> int:
        """Until the coordinator is in `phase` in an epoch after `after_epoch` (its state says so); that epoch."""
        changed = asyncio.Event()
        self.state.subscribe(lambda s: changed.set())
        try:
            async with asyncio.timeout(WAIT_S):
                while not (self.state.phase == phase and self.runtime.machine.epoch > after_epoch):
                    if self.run.done():
                        ended = self.run.exception() or self.run.result()
                        raise AssertionError(f"the coordinator ended ({ended!r}) before {phase}:\n{self.log()}")
                    changed.clear()
                    done = asyncio.ensure_future(changed.wait())
                    await asyncio.wait({done, self.run}, return_when=asyncio.FIRST_COMPLETED)
                    done.cancel()
        except TimeoutError:
            raise AssertionError(f"the coordinator did not reach {phase} within {WAIT_S:g} s:\n{self.log()}") from None
        return self.runtime.machine.epoch

    def log(self) -> str:
        return "\n".join(text for _, text in self.state.events)


@asynccontextmanager
async def coordinator(tmp: Path, model: Path, names: list[str], stall_s: float = 120.0,
                      on_connect: dict[str, OnConnect] | None = None, on_assign: dict[str, OnAssign] | None = None,
                      announced: dict[str, dict[str, Any]] | None = None,
                      models: dict[str, Path] | None = None) -> AsyncIterator[Coordinated]:
    """The real coordinator of a session of scripted members `names` (coordinate-only: it holds no stage);
    `announced`: a member's measurements in place of member_measurements()'s; `models`: the model file a
    member proves it holds."""
    async with loopback_rendezvous() as rdv, AsyncExitStack() as stack:
        opts = HostOptions(model=model, rendezvous=rdv, members=len(names), coordinate_only=True, wait_s=WAIT_S,
                           settings=replace(SETTINGS, stall_s=stall_s), api_port=None, bind=LOOPBACK,
                           cache_dir=tmp / "host-cache", name="host")
        ep, code = await endpoint(stack, rdv, "host", None, {})
        state = SessionState(phase="waiting")  # the session is open (coordinator.session)
        runtime = HostRuntime(ep, opts, state, model, describe_model(model), StageCache(opts.cache_dir), None)
        run = asyncio.create_task(runtime.run())
        members: dict[str, ScriptedMember] = {}
        readers: list[asyncio.Task[None]] = []
        try:
            for name in names:
                mep, _ = await endpoint(stack, rdv, name, code, (announced or {}).get(name, member_measurements()))
                inbox = Inbox(await connect_host(mep, WAIT_S))
                m = members[name] = ScriptedMember(name, mep, inbox, (on_connect or {}).get(name),
                                                   (on_assign or {}).get(name), model=(models or {}).get(name))
                inbox.on_message = m.answer
                readers.append(asyncio.create_task(inbox.read()))
            yield Coordinated(runtime, state, members, run)
        finally:
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            for r in readers:
                r.cancel()


@dataclass
class ScriptedHost:
    """The test as a member's coordinator: its end of the member's control link, and what came on it."""

    inbox: Inbox

    async def send(self, msg: messages.Control | bytes) -> None:
        await self.inbox.link.send(msg if isinstance(msg, bytes) else messages.encode(msg))


@dataclass
class MemberUnderTest:
    runtime: MemberRuntime
    host: ScriptedHost
    others: dict[str, PeerEndpoint]  # the session's other members' endpoints (the test's to drive)
    run: asyncio.Task[int]
    cache: StageCache

    async def first(self, kind: type[C], where: Callable[[C], bool] = lambda m: True, after: int = 0) -> C:
        """The member's first message of `kind` (see Inbox.first); an AssertionError once it has ended instead."""
        came = asyncio.ensure_future(self.host.inbox.first(kind, where, after))
        await asyncio.wait({came, self.run}, return_when=asyncio.FIRST_COMPLETED)
        if not came.done():
            came.cancel()
            ended = self.run.exception() or self.run.result()
            raise AssertionError(f"the member ended before a {kind.T!r} came: {ended!r}")
        return came.result()


@asynccontextmanager
async def member(tmp: Path, name: str, others: list[str], use: InUse | None = None,
                 cache_dir: Path | None = None) -> AsyncIterator[MemberUnderTest]:
    """A real member `name` connected to the test as its coordinator, beside endpoints `others` that joined too."""
    async with loopback_rendezvous() as rdv, AsyncExitStack() as stack:
        host_ep, code = await endpoint(stack, rdv, "host", None, {})
        ep, _ = await endpoint(stack, rdv, name, code, member_measurements())
        peers = {n: (await endpoint(stack, rdv, n, code, member_measurements()))[0] for n in others}
        control = await connect_host(ep, WAIT_S)
        host = ScriptedHost(Inbox(await host_ep.accept(WAIT_S)))
        reader = asyncio.create_task(host.inbox.read())
        cache = StageCache(cache_dir or tmp / "member-cache")
        opts = MemberOptions(code=code, rendezvous=rdv, name=name, bind=LOOPBACK, api_port=None,
                             cache_dir=cache.root, threads=1)
        runtime = MemberRuntime(ep, control, SessionState(phase="waiting"), opts, cache, None, use)  # joined, measured
        run = asyncio.create_task(runtime.run())
        try:
            yield MemberUnderTest(runtime, host, peers, run, cache)
        finally:
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
            reader.cancel()


SETTINGS = SessionSettings(context=64, concurrency=1, batch=32)
CONFIG = SETTINGS.config  # {"n_ctx_per_seq": 64, "n_seq_max": 1, "n_batch": 32}


def host_stage(tmp: Path) -> tuple[Path, StageManifest]:
    """A stage a host cuts (blocks [0, 3) of the embedded SmolLM2, in its own cache) and its manifest (7 chunks)."""
    path = StageCache(tmp / "host-cache").stage(default_model_path(), StageSpec(0, 3, head=False))
    return path, manifest_for(path)


def assign(epoch: int, manifest: StageManifest, fingerprints: dict[str, str] | None = None) -> messages.Assign:
    """ada's assignment of that stage: the body [0, 3) of a ring whose head is bo (`fingerprints`: the
    members' certificates, for a test that opens the ring's edges)."""
    return messages.Assign(epoch=epoch, order=("bo", "ada"), head="bo", ranges={"bo": (3, 30), "ada": (0, 3)},
                           settings=SETTINGS, plan={}, model="SmolLM2", stage=manifest,
                           fingerprints=fingerprints or {"bo": "b" * 64, "ada": "a" * 64})

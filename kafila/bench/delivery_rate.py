"""Stage delivery over one real Kafila link, host and member in two processes: the rate to hold against aioquic's.

The host process runs an in-process rendezvous and its endpoint; each member process joins, accepts the
host's link and receives one random stage file exactly as a ring member does (kafila.session.delivery.transfer:
verified chunk by chunk, written to its `.part` file); with several members the host feeds them all at
once, as the ring's host does. A member's clock runs from its word that it is ready to the moment every
chunk was accepted; the final whole-file check is timed apart. Set `profile_dir` to get a cProfile dump
of each side.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import multiprocessing as mp
import os
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kafila.session.delivery.stage_files import StageReceiver, manifest_for
from kafila.session.protocol.manifest import CHUNK_SIZE, StageManifest

Addr = tuple[str, int]


def _stage_file(folder: Path, size: int) -> Path:
    path = folder / "stage.gguf"
    with path.open("wb") as f:
        left = size
        while left > 0:
            f.write(os.urandom(min(left, CHUNK_SIZE)))
            left -= CHUNK_SIZE
    return path


async def _member(rdv: Addr, code: str, cache: Path, allow_direct: bool, pipe: Connection) -> None:
    from kafila.net.endpoint import PeerEndpoint
    from kafila.session.delivery.transfer import receive_stage

    async with PeerEndpoint(bind=("127.0.0.1", 0), name="member", allow_direct=allow_direct) as ep:
        await ep.probe_nat(rdv)
        await ep.join_session(rdv, code)
        await ep.announce({})
        await ep.wait_for_members(2, 30)
        link = await ep.accept(30)
        manifest = StageManifest.from_dict(json.loads(await link.recv(30)))
        receiver = StageReceiver(cache, manifest)
        receiver.missing()
        await link.send(b"ready")
        n = len(manifest.chunks)
        t0, cpu0 = time.perf_counter(), time.process_time()
        whole = [t0, cpu0]

        def progress(have: int) -> None:
            if have == n:  # every chunk accepted: the whole-file check after it is timed apart
                whole[:] = [time.perf_counter(), time.process_time()]

        await receive_stage(link, receiver, 60, aside=lambda raw: None, progress=progress)
        pipe.send({"chunks_s": whole[0] - t0, "cpu_s": whole[1] - cpu0, "finish_s": time.perf_counter() - whole[0]})
        await link.send(b"done")
        await link.recv(30)  # the host closes


def _member_main(rdv: Addr, code: str, cache: str, allow_direct: bool, pipe: Connection,
                 profile: str | None) -> None:
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        prof.enable()
    try:
        asyncio.run(_member(rdv, code, Path(cache), allow_direct, pipe))
    except Exception as exc:  # reported to the host, which raises it
        pipe.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        if prof is not None and profile is not None:
            prof.disable()
            prof.dump_stats(profile)


async def _host(size: int, folder: Path, allow_direct: bool, members: int,
                profile_dir: Path | None) -> dict[str, Any]:
    from kafila.net.endpoint import PeerEndpoint
    from kafila.net.ports import free_udp_pair
    from kafila.session.delivery.transfer import send_stage
    from rendezvous.server import RendezvousServer

    src = _stage_file(folder, size)
    manifest = await asyncio.to_thread(manifest_for, src)
    server = RendezvousServer("127.0.0.1", free_udp_pair("127.0.0.1"))
    await server.start()
    rdv = ("127.0.0.1", server.port)
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    pipes: list[Connection] = []
    try:
        async with PeerEndpoint(bind=("127.0.0.1", 0), name="host", allow_direct=allow_direct) as ep:
            await ep.probe_nat(rdv)
            code = await ep.create_session(rdv)
            for i in range(members):
                ours, theirs = ctx.Pipe()
                profile = str(profile_dir / f"member-{i}.prof") if profile_dir is not None else None
                proc = ctx.Process(target=_member_main, daemon=True,
                                   args=(rdv, str(code), str(folder / f"cache-{i}"), allow_direct, theirs, profile))
                proc.start()
                procs.append(proc)
                pipes.append(ours)
            await ep.announce({})
            await ep.wait_for_members(members + 1, 120)
            peers = [p for p in ep.peers.values() if p.member_id != ep.member_id]
            links = [await ep.connect(p, 30) for p in peers]
            if allow_direct:
                for p in peers:
                    await ep.settle_path(p)
            for link in links:
                await link.send(json.dumps(manifest.as_dict()).encode())
            for link in links:
                if await link.recv(60) != b"ready":
                    raise RuntimeError("a member did not get ready")
            prof = cProfile.Profile() if profile_dir is not None else None
            if prof is not None:
                prof.enable()
            t0, cpu0 = time.perf_counter(), time.process_time()
            # as the ring's host does: one sender per member, all at once
            await asyncio.gather(*(send_stage(link, src, manifest, range(len(manifest.chunks))) for link in links))
            sent_s = time.perf_counter() - t0
            answers = [await link.recv(600) for link in links]
            host_cpu = time.process_time() - cpu0  # waiting for the members' whole-file checks costs none
            if prof is not None and profile_dir is not None:
                prof.disable()
                prof.dump_stats(str(profile_dir / "host.prof"))
            results: list[dict[str, Any]] = []
            for pipe in pipes:
                results.append(await asyncio.to_thread(pipe.recv) if pipe.poll(30) else {"error": "no report"})
            for answer, result in zip(answers, results, strict=True):
                if answer != b"done" or "error" in result:
                    raise RuntimeError(f"a member failed: {result.get('error', answer)!r}")
            datagram = min(link.conn.datagram_size for link in links)
            path = links[0].path
            for link in links:
                await link.close()
    finally:
        server.close()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
    # each member times from its "ready", sent before the host starts: the slowest one is the span of all
    seconds = max(r["chunks_s"] for r in results)
    return {"bytes": size * members, "seconds": seconds, "mb_per_s": size * members / seconds / 1e6,
            "members": members, "per_member_mb_per_s": [size / r["chunks_s"] / 1e6 for r in results],
            "sent_s": sent_s, "finish_s": max(r["finish_s"] for r in results), "datagram_bytes": datagram,
            "path": path, "sender_cpu_ms_per_mb": host_cpu * 1e3 / (size * members / 1e6),
            "receiver_cpu_ms_per_mb": sum(r["cpu_s"] for r in results) * 1e3 / (size * members / 1e6)}


def delivery_rate(size: int, allow_direct: bool = True, members: int = 1,
                  profile_dir: Path | None = None) -> dict[str, Any]:
    """Bytes, seconds and MB/s of a `size`-byte stage delivered from one host to `members` members at once
    (all members together: `bytes` is size × members)."""
    with tempfile.TemporaryDirectory(prefix="kafila-delivery-") as tmp:
        return asyncio.run(_host(size, Path(tmp), allow_direct, members, profile_dir))

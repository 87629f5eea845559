"""`kafila rendezvous`: run the rendezvous role (registry, probe responder, blind relay)."""

from __future__ import annotations

import argparse

HELP = "run a rendezvous: session registry, NAT probe responder on UDP P and P+1, blind relay"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="address to serve on (default all)")
    p.add_argument("--port", type=int, default=3478, help="UDP port P; probes also use P+1 (default 3478)")
    p.add_argument("--alt-ip", default=None, help="a second address of this machine, to tell mapping kinds apart")
    p.add_argument("--stats-every", type=float, default=60.0, help="seconds between counter log lines")
    p.add_argument("--max-sessions", type=_positive, default=None, metavar="N",
                   help="sessions the table holds at most (default 100,000; its bytes are bounded too)")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--max-sessions must be a whole number of at least 1, not {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from rendezvous.limits import Limits
    from rendezvous.server import RendezvousServer

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafila.rendezvous").setLevel(logging.INFO)
    limits = Limits() if args.max_sessions is None else Limits(max_sessions=args.max_sessions)
    server = RendezvousServer(args.host, args.port, args.alt_ip, limits)

    async def serve() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)  # stop cleanly: sockets closed, a last log line
        try:
            await server.serve_forever(args.stats_every)
        except asyncio.CancelledError:
            logging.getLogger("kafila.rendezvous").info("rendezvous stopped")

    asyncio.run(serve())
    return 0

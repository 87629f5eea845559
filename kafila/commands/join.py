"""`kafila join CODE`: make this machine a member of a session."""

from __future__ import annotations

import argparse
import socket

HELP = "join a session with its code and serve a stage of the model"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("code", help="the join code the host printed")
    p.add_argument("--rendezvous", default="127.0.0.1:3478", help="rendezvous HOST:PORT (default 127.0.0.1:3478)")
    p.add_argument("--name", default=socket.gethostname(), help="this member's name (default: the host name)")
    p.add_argument("--api-port", type=int, default=8711, help="local chat API port (default 8711; 0: any; -1: none)")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default 0: all cores)")
    p.add_argument("--throttle", type=float, default=1.0, help="EMULATION: run this many times slower")
    p.add_argument("--memory", type=float, default=None, metavar="GB", help="EMULATION: report at most this memory")


def run(args: argparse.Namespace) -> int:
    from kafila.errors import SessionError
    from kafila.session.member import run_member
    from kafila.session.options import MemberOptions, parse_addr
    from kafila.session.printer import run_printing

    if args.throttle < 1.0:
        raise SessionError(f"--throttle must be at least 1 (it emulates a slower machine), got {args.throttle}")
    import os
    from pathlib import Path

    trace = os.environ.get("KAFILA_TRACE")  # tests: where the head records its batches
    opts = MemberOptions(
        code=args.code, rendezvous=parse_addr(args.rendezvous), name=args.name,
        api_port=None if args.api_port < 0 else args.api_port, throttle=args.throttle, memory_gb=args.memory,
        threads=args.threads,
        trace_path=Path(trace) if trace else None,
    )
    return run_printing(lambda state: run_member(opts, state))

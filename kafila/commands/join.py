"""`kafila join [CODE | -]`: make this machine a member of a session."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO

from kafila.commands._common import draft_arg, link_rate_arg, read_link_rate

if TYPE_CHECKING:
    from kafila.net.trust import JoinCode

HELP = "join a session with its code and serve a stage of the model"
ENV_JOIN_CODE = "KAFILA_JOIN_CODE"
CODE_HELP = (f"the join code the host printed; '-' reads it from standard input; without it, {ENV_JOIN_CODE} "
             "or a prompt (a code given here is visible to other local users in ps)")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("code", nargs="?", default=None, help=CODE_HELP)
    p.add_argument("--rendezvous", default="127.0.0.1:3478", help="rendezvous HOST:PORT (default 127.0.0.1:3478)")
    p.add_argument("--name", default=socket.gethostname(), help="this member's name (default: the host name)")
    p.add_argument("--api-port", type=int, default=8711, help="local chat API port (default 8711; 0: any; -1: none)")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default 0: all cores)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="this machine's copy of the host's model (GGUF path or name): the stage is cut here "
                        "instead of sent, after the host checks the file's sha256 against its own")
    draft_arg(p)
    p.add_argument("--throttle", type=float, default=1.0, help="EMULATION: run this many times slower")
    p.add_argument("--throttle-schedule", default=None, metavar="S:F,...",
                   help="EMULATION: from S seconds after first serving on, run F times slower (e.g. 0:1,60:4)")
    p.add_argument("--memory", type=float, default=None, metavar="GB", help="EMULATION: report at most this memory")
    p.add_argument("--link-delay", type=float, default=0.0, metavar="MS",
                   help="EMULATION: send every datagram this many ms late (a member far away: its links see the RTT)")
    link_rate_arg(p)


def read_join_code(given: str | None, stdin: TextIO | None = None, environ: Mapping[str, str] | None = None,
                   prompt: TextIO | None = None) -> JoinCode:
    """The join code from the argument, '-' (a line of stdin), KAFILA_JOIN_CODE or a prompt; SessionError if bad."""
    from kafila.errors import SessionError
    from kafila.net.trust import JoinCode

    stdin = sys.stdin if stdin is None else stdin
    environ = os.environ if environ is None else environ
    if given == "-":
        text = stdin.readline()
    elif given:
        text = given
    elif environ.get(ENV_JOIN_CODE, "").strip():
        text = environ[ENV_JOIN_CODE]
    elif stdin.isatty():
        out = sys.stderr if prompt is None else prompt
        out.write("join code: ")  # on stderr: stdout may be a pipe to a log
        out.flush()
        text = stdin.readline()
    else:
        raise SessionError(f"no join code: give it as an argument, '-' to read it from standard input, "
                           f"or in {ENV_JOIN_CODE}")
    if not text.strip():
        raise SessionError("the join code is empty")
    return JoinCode.parse(text)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kafila.errors import SessionError

    # The command line is checked first, before the heavy imports: a mistyped code fails in a blink.
    code = read_join_code(args.code)
    if args.throttle < 1.0:
        raise SessionError(f"--throttle must be at least 1 (it emulates a slower machine), got {args.throttle}")
    from kafila.session.options import MAX_LINK_DELAY_MS

    if not 0 <= args.link_delay <= MAX_LINK_DELAY_MS:
        raise SessionError(f"--link-delay is milliseconds from 0 to {MAX_LINK_DELAY_MS:g}, got {args.link_delay:g}")
    from kafila.session.emulation import parse_schedule

    schedule = parse_schedule(args.throttle_schedule) if args.throttle_schedule else ()
    link_rate = read_link_rate(args.link_rate)
    from kafila.session.member.join import run_member
    from kafila.session.options import MemberOptions, parse_addr
    from kafila.session.terminal.printer import run_printing

    trace = os.environ.get("KAFILA_TRACE")  # tests: where the head records its batches
    opts = MemberOptions(
        code=str(code), rendezvous=parse_addr(args.rendezvous), name=args.name,
        api_port=None if args.api_port < 0 else args.api_port, memory_gb=args.memory, link_delay_ms=args.link_delay,
        link_rate=link_rate,
        throttle=schedule[0][1] if schedule else args.throttle, throttle_schedule=schedule,
        threads=args.threads, model=Path(args.model) if args.model else None,
        trace_path=Path(trace) if trace else None, draft=Path(args.draft) if args.draft else None,
    )
    return run_printing(lambda state: run_member(opts, state))

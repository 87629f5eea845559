"""`kafila host`: open a session, print the join code, plan, deliver stages, admit or reject; serve a stage too."""

from __future__ import annotations

import argparse
import socket

from kafila.commands._common import (
    chat_template_arg,
    draft_arg,
    link_rate_arg,
    positive_int,
    positive_seconds,
    read_chat_template,
    read_link_rate,
    speculate_arg,
)

HELP = "open a session for a model, coordinate it and serve a stage of it (prints the join code)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="GGUF file (default: the embedded SmolLM2-135M)")
    p.add_argument("--rendezvous", default="127.0.0.1:3478", help="rendezvous HOST:PORT (default 127.0.0.1:3478)")
    p.add_argument("--members", type=int, default=3,
                   help="members to wait for before planning, besides this machine (default 3)")
    p.add_argument("--wait", type=positive_seconds, default=120.0,
                   help="seconds to wait for them to arrive (default 120); one that arrived is waited for while it "
                        "measures its machine, up to --measure-wait")
    p.add_argument("--measure-wait", type=positive_seconds, default=900.0,
                   help="seconds each member that arrived may take to measure its machine, from when its own "
                        "measurement began (default 900: a slow laptop's three probe attempts); then the session is "
                        "planned without it, and it is planned in later if it finishes")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent requests to admit (default 4)")
    p.add_argument("--context", type=int, default=2048, help="context per request in tokens (default 2048)")
    p.add_argument("--batch", type=positive_int, default=128,
                   help="most prompt tokens per call: long prompts go round the ring in chunks of this size "
                        "(default 128)")
    p.add_argument("--api-port", type=int, default=8711, help="local chat API port (default 8711; -1: none)")
    p.add_argument("--mixed-builds", action="store_true",
                   help="admit members whose llama.cpp build differs from this one (the ring is then not bit-exact)")
    p.add_argument("--coordinate-only", action="store_true",
                   help="only coordinate: this machine holds no stage (by default it serves one, like a member)")
    p.add_argument("--name", default=socket.gethostname(),
                   help="this machine's name as a ring member (default: the host name)")
    p.add_argument("--threads", type=int, default=0, help="llama.cpp threads of this machine's stage (default 0: all)")
    p.add_argument("--stall-limit", type=float, default=120.0,
                   help="seconds a member may show no progress while its stage is delivered, loaded or connected "
                        "before it is dropped and named (default 120; progress, not a deadline)")
    draft_arg(p)
    speculate_arg(p)
    chat_template_arg(p)
    p.add_argument("--source", action="append", default=[], metavar="URL",
                   help="a public URL of the same model file (a Hugging Face or mirror 'resolve' URL; repeatable): "
                        "members fetch their stages there, every chunk checked against this host's sha256s, and this "
                        "host sends only what it cannot (a model from the Hugging Face cache offers its URL itself)")
    p.add_argument("--no-replan", action="store_true", help="end the session when a member is lost")
    link_rate_arg(p)
    p.add_argument("--no-copy", action="store_true",
                   help="give no member a copy of the model (by default, when no other member holds it, one gets a "
                        "copy on disk, so that the session outlives this machine)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kafila.session.delivery.model_source import offered_urls
    from kafila.session.launch.host import run_host
    from kafila.session.options import HostOptions, parse_addr
    from kafila.session.settings import SessionSettings
    from kafila.session.terminal.printer import run_printing

    settings = SessionSettings(
        context=args.context, concurrency=args.concurrency, batch=args.batch, speculate=args.speculate,
        replan=not args.no_replan, copy=not args.no_copy, stall_s=args.stall_limit, measure_wait_s=args.measure_wait,
        mixed_builds=args.mixed_builds, chat_template=read_chat_template(args.chat_template),
        sources=offered_urls(Path(args.model), args.source) if args.model else tuple(args.source),
    )
    opts = HostOptions(
        model=Path(args.model) if args.model else None, rendezvous=parse_addr(args.rendezvous),
        members=args.members, wait_s=args.wait, settings=settings,
        api_port=None if args.api_port < 0 else args.api_port, coordinate_only=args.coordinate_only, name=args.name,
        threads=args.threads, draft=Path(args.draft) if args.draft else None, link_rate=read_link_rate(args.link_rate),
    )
    return run_printing(lambda state: run_host(opts, state))


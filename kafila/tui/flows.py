"""The thin layer between `kafila tui`'s options and the session flows.

A flow is ``async (state) -> exit status`` that runs a session and keeps `state` up to date until
it ends or is cancelled: `run_host(HostOptions, state)`, `run_member(MemberOptions, state)` and
`run_demo(DemoOptions, state)`. Options the user did not give keep the flows' own defaults.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from kafila.tui.app import Flow


def _given(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def flow_for(args: argparse.Namespace) -> tuple[Flow, str]:
    """The flow `args` asks for, and a short label for the session bar."""
    from kafila.session.options import HostOptions, MemberOptions, parse_addr
    from kafila.session.settings import SessionSettings

    rendezvous = parse_addr(args.rendezvous) if args.rendezvous else None
    common = _given(concurrency=args.concurrency, context=args.context, api_port=args.api_port)
    mixed = getattr(args, "mixed_builds", None)
    if args.demo:
        from kafila.session.launch.demo import DemoOptions, run_demo

        return partial(run_demo, DemoOptions(**common, **_given(mixed_builds=mixed))), "demo"
    if args.host is not None:
        from kafila.session.launch.host import run_host

        model = Path(args.host).expanduser() if args.host else None
        settings = SessionSettings(**_given(concurrency=args.concurrency, context=args.context, mixed_builds=mixed))
        opts = HostOptions(**_given(model=model, rendezvous=rendezvous, members=args.members, api_port=args.api_port,
                                    coordinate_only=getattr(args, "coordinate_only", None), name=args.name),
                           settings=settings)
        return partial(run_host, opts), "host"
    from kafila.session.member.join import run_member

    opts_m = MemberOptions(**_given(code=args.join, rendezvous=rendezvous, name=args.name, api_port=args.api_port))
    return partial(run_member, opts_m), "member"

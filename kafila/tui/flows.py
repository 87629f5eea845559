"""The thin layer between `kafila tui`'s options and the session runner's flows.

A flow is ``async (state) -> exit status`` that runs a session and keeps `state` up to date until
it ends or is cancelled: the session runner's `run_host(HostOptions, state)`,
`run_member(MemberOptions, state)` and `run_demo(DemoOptions, state)`. They are looked up when
asked for, so the dashboard works (replay, attach) in a build whose runner lacks one of them.
"""

from __future__ import annotations

import argparse
import importlib
from functools import partial
from pathlib import Path
from typing import Any

from kafila.errors import SessionError
from kafila.tui.app import Flow

# Where each flow lives, newest layout first (the runner module, then the per-role modules).
PLACES = {
    "run_host": ("kafila.session.runner", "kafila.session.host"),
    "run_member": ("kafila.session.runner", "kafila.session.member"),
    "run_demo": ("kafila.session.runner", "kafila.session.demo"),
}


def _find(name: str) -> Any:
    for module_name in PLACES[name]:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        if hasattr(module, name):
            return getattr(module, name)
    raise SessionError(f"this build of Kafila has no session runner for that ({name}); "
                       "use --replay STATE.json or --attach URL")


OPTION_PLACES = ("kafila.session.options", "kafila.session.demo", "kafila.session.runner")


def _options(class_name: str, **fields: Any) -> Any:
    """Build the runner's option dataclass, passing only the fields it has (it is still evolving)."""
    import dataclasses

    cls = None
    for module_name in OPTION_PLACES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name, None)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
        if cls is not None:
            break
    if cls is None:
        raise SessionError(f"this build of Kafila has no {class_name}; use --replay or --attach")
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in known and v is not None})


def flow_for(args: argparse.Namespace) -> tuple[Flow, str]:
    """The flow `args` asks for, and a short label for the session bar."""
    rendezvous = None
    if args.rendezvous:
        from kafila.session.options import parse_addr

        rendezvous = parse_addr(args.rendezvous)
    if args.demo:
        opts = _options("DemoOptions", concurrency=args.concurrency, context=args.context,
                        api_port=args.api_port)
        return partial(_find("run_demo"), opts), "demo"
    if args.host is not None:
        model = Path(args.host).expanduser() if args.host else None
        opts = _options("HostOptions", model=model, rendezvous=rendezvous, members=args.members,
                        concurrency=args.concurrency, context=args.context, api_port=args.api_port)
        return partial(_find("run_host"), opts), "host"
    opts = _options("MemberOptions", code=args.join, rendezvous=rendezvous, name=args.name, api_port=args.api_port)
    return partial(_find("run_member"), opts), "member"

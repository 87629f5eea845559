"""Command-line boundary: parses arguments, dispatches to kafila.commands, turns errors into messages."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from kafila import __version__
from kafila.errors import KafilaError, first_kafila_error
from kafila.process import follow_parent
from kafila.stopping import start_deadline

# Command name -> module under kafila.commands. Modules must stay cheap to import
# (heavy imports such as llama_cpp go inside run()), so `kafila --help` starts fast.
COMMANDS: dict[str, str] = {
    "inspect": "inspect_model",
    "models": "models",
    "generate": "generate",
    "probe": "probe",
    "plan": "plan",
    "rendezvous": "rendezvous",
    "bench": "bench",
    "host": "host",
    "join": "join",
    "chat": "chat",
    "demo": "demo",
    "tui": "tui",
    "cache": "cache",
}

log = logging.getLogger("kafila")


def version_text() -> str:
    """The version line, with the llama.cpp build identity members compare before admission."""
    try:
        from kafila.engine.build import build_identity

        return f"kafila {__version__} ({build_identity().describe()})"
    except ImportError:
        return f"kafila {__version__}"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and llama.cpp build, then exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one sub-command per module in kafila.commands."""
    parser = argparse.ArgumentParser(prog="kafila", description="Pool a trusted group's machines into one LLM ring.")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"kafila.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def _terminate(_signum: int, _frame: object) -> None:
    # (a session flow running in the main thread's event loop is cancelled instead: kafila.stopping)
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    start_deadline(loop)
    raise KeyboardInterrupt


def run_process() -> NoReturn:
    """The process's entry point: run `main` and exit with its status."""
    try:
        status = main()
    finally:
        # Python restores SIGTERM's default action while it shuts down, so a stop requested just as
        # the process exits by itself (a test stopping a cluster) would turn a clean exit into death
        # by signal. The exit status is decided; from here a SIGTERM has nothing left to stop.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; KafilaError becomes a one-line message and exit status 1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        # SIGTERM unwinds like Ctrl-C, so sessions say goodbye and child processes are stopped. The
        # handler is installed inside the try: a SIGTERM at once (a demo stopping a member it just
        # started, a parent already gone) is an interrupt like any other, not a traceback.
        signal.signal(signal.SIGTERM, _terminate)
        follow_parent()
        return int(args._run(args) or 0)
    except KafilaError as exc:
        print(f"kafila: error: {exc}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:  # raised out of a TaskGroup: report its first user-facing error
        first = first_kafila_error(group)
        if first is None:
            raise
        print(f"kafila: error: {first}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kafila: interrupted", file=sys.stderr)
        return 130

"""`kafila tui`: the dashboard — run a session (demo, host, join) and watch it live, then chat through it.

Also `--replay STATE.json` renders a recorded state (docs, tests) and `--attach URL` follows a
session already running (from any member's machine) through its API.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kafila.errors import SessionError

HELP = "the dashboard: run a session (--demo, --host, --join) and watch the planner and the ring live, then chat"


def configure(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--demo", action="store_true",
                      help="a whole session on this machine: a rendezvous, three members and the host (default)")
    what.add_argument("--host", nargs="?", const="", default=None, metavar="MODEL",
                      help="open a session serving MODEL (a GGUF file; default: the embedded SmolLM2)")
    what.add_argument("--join", nargs="?", const="", default=None, metavar="CODE",
                      help="join the session with this join code ('-': read it from standard input; without "
                      "it: KAFILA_JOIN_CODE or a prompt)")
    what.add_argument("--replay", metavar="STATE.json", help="render a recorded session state (no session runs)")
    what.add_argument("--attach", metavar="URL", help="follow a running session through its API (e.g. "
                      "http://127.0.0.1:8711)")
    p.add_argument("--rendezvous", metavar="HOST:PORT", help="the rendezvous to use (default 127.0.0.1:3478)")
    p.add_argument("--name", help="this machine's name as a ring member (--host, --join; default: the host name)")
    p.add_argument("--members", type=int, default=None, help="members to wait for, besides this machine (--host)")
    p.add_argument("--coordinate-only", action="store_true", default=None,
                   help="(--host) only coordinate: this machine holds no stage (by default it serves one)")
    p.add_argument("--mixed-builds", action="store_true", default=None,
                   help="admit members of another llama.cpp build (--host, --demo; the ring is then not bit-exact)")
    p.add_argument("--concurrency", type=int, default=None, help="concurrent requests to admit")
    p.add_argument("--context", type=int, default=None, help="tokens of context per request")
    p.add_argument("--api-port", type=int, default=None,
                   help="serve the chat API on this loopback port (default 8711; 0: any free one)")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per chat reply (default 512)")
    p.add_argument("--temperature", type=float, default=0.7, help="chat sampling temperature (default 0.7)")
    p.add_argument("--record", metavar="STATE.json", help="write the session's last state here on exit "
                   "(replay it with --replay)")


def load_state(path: str) -> object:
    """A SessionState from a JSON file written by --record or SessionState.to_json()."""
    from kafila.session.state import SessionState

    try:
        data = json.loads(Path(path).expanduser().read_text())
        return SessionState.from_json(data)
    except OSError as exc:
        raise SessionError(f"cannot read the recorded state {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:
        raise SessionError(f"{path} is not a recorded Kafila session state ({exc})") from None


def run(args: argparse.Namespace) -> int:
    from kafila.session.state import SessionState
    from kafila.session.terminal.transcripts import data_dir
    from kafila.tui.app import KafilaApp
    from kafila.tui.terminal import own_terminal
    from kafila.tui.widgets.chat import ChatSettings

    settings = ChatSettings(max_tokens=args.max_tokens, temperature=args.temperature)
    if args.replay:
        state = load_state(args.replay)
        assert isinstance(state, SessionState)
        app = KafilaApp(state, mode="replay", settings=settings)
    elif args.attach:
        app = KafilaApp(SessionState(phase="connecting"), attach=args.attach, mode="attached", settings=settings)
    else:
        from kafila.commands.join import read_join_code
        from kafila.tui.flows import flow_for

        if args.join is not None:  # read and checked before the screen opens (a prompt needs the terminal)
            args.join = str(read_join_code(args.join or None))
        if not (args.host is not None or args.join):
            args.demo = True
        flow, mode = flow_for(args)  # errors here (no runner, bad address) print before the screen opens
        app = KafilaApp(SessionState(), flow=flow, mode=mode, settings=settings)
    log_path = data_dir() / "logs" / "tui.log"
    with own_terminal(log_path):
        app.run()
    if args.record:
        Path(args.record).expanduser().write_text(json.dumps(app.state.to_json(), indent=1))
    return app.status or app.return_code or 0  # return_code: 1 when the app itself failed

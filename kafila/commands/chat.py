"""`kafila chat`: a plain terminal chat with a running session, from any member's machine.

Reads a line, streams the reply as it arrives, prints tokens/s and each stage's measured
against predicted time. Every conversation is saved as it happens (kafila.session.terminal.transcripts).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from kafila.session.api.client import ApiClient
    from kafila.session.terminal.transcripts import Conversation

HELP = "chat in this terminal with a running Kafila session (any member's machine can serve it)"
COMMANDS_HELP = "/new starts a new conversation, /quit leaves (Ctrl-D too); Ctrl-C stops a reply"


def configure(p: argparse.ArgumentParser) -> None:
    from kafila.session.api.client import DEFAULT_API_URL

    p.add_argument("--api", metavar="URL",
                   help=f"the session's chat API (default {DEFAULT_API_URL}, or where a session of yours moved "
                        "when another program held that port)")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per reply (default 512)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7; 0 = greedy)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from kafila.session.api.client import DEFAULT_API_URL, ApiClient
    from kafila.session.api.token import own_session_url
    from kafila.session.terminal.transcripts import Conversation, chats_dir, shown

    try:
        import readline  # noqa: F401  (line editing and history for input(), where the platform has it)
    except ImportError:
        pass
    console = Console(highlight=False)
    api = ApiClient(args.api or own_session_url(DEFAULT_API_URL))
    # Fail early, with the message that says how to start a session, before the user types.
    models = asyncio.run(_models(api))
    model = models[0] if models else "kafila"
    console.print(f"[bold]Kafila chat[/] at {api.url} (model {model}). {COMMANDS_HELP}.", soft_wrap=True)
    console.print(f"[dim]transcripts are saved in {shown(chats_dir())}[/]")
    conv: Conversation | None = None
    try:
        while True:
            try:
                line = input("you> ")
            except EOFError:
                console.print()
                return 0
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit", "/q"):
                return 0
            if text == "/new":
                if conv is not None:
                    conv.close()
                conv = None
                console.print("[dim]— new conversation —[/]")
                continue
            if text.startswith("/") and " " not in text:
                console.print(f"[yellow]unknown command {text}[/]: {COMMANDS_HELP}")
                continue
            if conv is None:
                conv = Conversation.create(api=api.url)
            conv.add_user(line)
            _reply(console, api, conv, model, args.max_tokens, args.temperature)
    finally:
        if conv is not None:
            conv.close()


async def _models(api: ApiClient) -> list[str]:
    try:
        return await api.models()
    finally:
        await api.close()


def _reply(console: Console, api: ApiClient, conv: Conversation, model: str, max_tokens: int,
           temperature: float) -> None:
    """Stream one reply to stdout and into the transcript; errors and Ctrl-C end the reply, not the chat."""
    from kafila.errors import KafilaError

    sys.stdout.write("kafila> ")
    sys.stdout.flush()
    try:
        stats = asyncio.run(_stream(api, conv, model, max_tokens, temperature))
    except KeyboardInterrupt:
        conv.end_reply(error="stopped by the user")
        console.print("\n[yellow](reply stopped)[/]")
        return
    except KafilaError as exc:
        conv.end_reply(error=str(exc))
        console.print(f"\n[red]reply failed:[/] {exc}")
        return
    sys.stdout.write("\n")
    if stats:
        console.print(f"[dim]{stats}[/]", soft_wrap=True)


async def _stream(api: ApiClient, conv: Conversation, model: str, max_tokens: int, temperature: float) -> str:
    from kafila.session.api.client import Notice, Progress, ReplyStats

    summary, raw = "", None
    progress = False  # a progress line is showing on stderr (rewritten in place, cleared by the reply)
    try:
        # a base model (no chat template) gets each line completed as raw text; the client says so once
        async for item in api.stream_reply(conv.history(), model=model, max_tokens=max_tokens,
                                           temperature=temperature):
            if isinstance(item, ReplyStats):
                summary, raw = item.summary(), item.raw
                continue
            if isinstance(item, Notice):
                print(f"\n[{item.text}]", file=sys.stderr, flush=True)
                continue
            if isinstance(item, Progress):
                print(f"\r[{item.line()}]", end="", file=sys.stderr, flush=True)
                progress = True
                continue
            if progress:
                print("\r\033[K", end="", file=sys.stderr, flush=True)
                progress = False
            conv.add_delta(item)
            sys.stdout.write(item)
            sys.stdout.flush()
    finally:
        # One asyncio.run per reply, so the connection pool must not outlive this loop.
        await api.close()
    conv.end_reply(stats=raw)
    return summary

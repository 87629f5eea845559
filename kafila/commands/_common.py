"""Argument helpers shared by commands."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafila.net.rate import LinkRate


def draft_arg(p: argparse.ArgumentParser) -> None:
    """`--draft PATH`: this machine's draft model for the head's speculation (join, host)."""
    p.add_argument("--draft", default=None, metavar="PATH",
                   help="a small GGUF with the model's vocabulary on this machine: as the head, it drafts tokens for "
                        "speculation (e.g. Qwen3-0.6B for Qwen3-32B)")


def speculate_arg(p: argparse.ArgumentParser) -> None:
    """`--speculate MODE`: how the session's head drafts (host, demo)."""
    from kafila.session.protocol.fields import SPECULATION_MODES

    p.add_argument("--speculate", choices=SPECULATION_MODES, default="auto",
                   help="how the head drafts tokens for speculation: auto (the draft model if the head has one, else "
                        "prompt lookup, only when the ring's measured costs say it pays; the default), lookup or "
                        "draft (whenever they can), off")


def chat_template_arg(p: argparse.ArgumentParser) -> None:
    """`--chat-template FILE`: a Jinja chat template that replaces the model's own (host, demo)."""
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template (as llama.cpp's --chat-template-file takes) that replaces the model's "
                        "own: how chats, tools and tool results are rendered for the model")


def read_chat_template(path: str | None) -> str | None:
    """The text of a `--chat-template` file, checked to be a template llama.cpp's way of rendering can run."""
    if path is None:
        return None
    from pathlib import Path

    from kafila.engine.chat.template import ChatTemplate
    from kafila.errors import KafilaError
    from kafila.session.protocol.fields import MAX_CHAT_TEMPLATE  # it travels to the head in the assign message

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KafilaError(f"cannot read the chat template {path}: {exc}") from None
    if len(text) > MAX_CHAT_TEMPLATE:
        raise KafilaError(f"the chat template {path} holds {len(text)} characters; at most "
                          f"{MAX_CHAT_TEMPLATE} are accepted")
    try:
        ChatTemplate(text)
    except Exception as exc:  # jinja2's syntax errors name the line
        raise KafilaError(f"the chat template {path} is not a template Kafila can render: {exc}") from None
    return text


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1, with the reason when it is not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0, with the reason when it is not."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="a GGUF file, or a model by name: smollm2 (the default, embedded) or gemma3 (Gemma 3 270M)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=40, help="sample from the k likeliest tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--context", type=int, default=2048, help="context length per request in tokens (default 2048)")


@contextlib.contextmanager
def byte_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr fed by (done, total) byte callbacks."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def link_rate_arg(p: argparse.ArgumentParser) -> None:
    """`--link-rate UP[/DOWN]`: EMULATION of this machine's connection (join, host, demo)."""
    p.add_argument("--link-rate", default=None, metavar="MBIT[/MBIT]",
                   help="EMULATION: cap what this machine sends (and receives) at this many Mbit/s, one number "
                        "for both ways or UP/DOWN (a home connection)")


def read_link_rate(text: str | None) -> LinkRate | None:
    """The parsed `--link-rate`, or None; SessionError naming the flag."""
    from kafila.errors import SessionError
    from kafila.net.rate import LinkRate

    if text is None:
        return None
    try:
        return LinkRate.parse(text)
    except ValueError as exc:
        raise SessionError(str(exc)) from None


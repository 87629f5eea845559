"""Chat transcripts on disk, written as the conversation happens so a dying session loses nothing.

Where: ``$KAFILA_DATA_DIR/chats`` when that variable is set, else
``platformdirs.user_data_dir("kafila")/chats``.

Format: one JSON Lines file per conversation, ``<id>.jsonl``, append-only; each line is one
record, flushed when written, so a crash mid-reply leaves every earlier line intact::

    {"type": "meta", "id": "...", "created": 1764500000.0, "api": "http://…", "title": "…"}
    {"type": "user", "time": …, "content": "hello"}           # written before the request is sent
    {"type": "delta", "content": "Hel"}                       # reply pieces as they stream in
    {"type": "end", "time": …, "stats": {…}}                  # or {"type": "end", "error": "…"}

The unsent text of the input box is kept beside it in ``<id>.draft`` (replaced on each change,
removed on send). `Conversation.load` rebuilds the messages; a reply whose "end" never came
is kept and marked interrupted.

Conversations are private: the directory is 0700 (tightened when an older one was not) and every
file is created 0600, so other users of the machine cannot read them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

ENV_DATA_DIR = "KAFILA_DATA_DIR"


def data_dir() -> Path:
    """Kafila's per-user data directory (``KAFILA_DATA_DIR`` overrides the platform default)."""
    override = os.environ.get(ENV_DATA_DIR)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("kafila"))


def chats_dir() -> Path:
    """Where conversations are saved."""
    return data_dir() / "chats"


def private_dir(directory: Path) -> Path:
    """Create `directory` (and its parents) readable by this user only; an existing one is tightened."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)  # mkdir's mode is cut by the umask, and an older directory may be 0755
    return directory


def _open_private(path: Path, flag: int) -> TextIO:
    """Open `path` for writing as a 0600 file (created with that mode: never readable by others, not even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8")


def _title(first_message: str) -> str:
    """A conversation's title: the start of its first message."""
    text = first_message.strip()
    return text.splitlines()[0][:40] if text else ""


def shown(path: Path) -> str:
    """A path as a person reads it: the home directory as ~."""
    home = Path.home()
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)


@dataclass
class Message:
    """One chat message; an assistant reply may still be streaming or may have been interrupted."""

    role: str  # "user" | "assistant"
    content: str
    stats: dict[str, Any] | None = None  # the reply's kafila stats, when it finished
    error: str | None = None  # why the reply stopped early
    done: bool = True


@dataclass
class Conversation:
    """A conversation and its append-only transcript file."""

    id: str
    path: Path
    title: str = ""
    messages: list[Message] = field(default_factory=list)
    _file: TextIO | None = field(default=None, repr=False, compare=False)

    # -- creating and loading -------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path | None = None, api: str | None = None, title: str = "") -> Conversation:
        """A new, empty conversation whose file is created (with its meta line) at once."""
        directory = directory if directory is not None else chats_dir()
        private_dir(directory)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
        # A counter makes two conversations started within the same second distinct.
        for n in range(1000):
            cid = stamp if n == 0 else f"{stamp}-{n}"
            path = directory / f"{cid}.jsonl"
            try:
                handle = _open_private(path, os.O_EXCL)
            except FileExistsError:
                continue
            conv = cls(cid, path, title)
            conv._file = handle
            conv._write({"type": "meta", "id": cid, "created": time.time(), "api": api, "title": title})
            return conv
        raise FileExistsError(f"cannot create a new transcript in {directory}")

    @classmethod
    def load(cls, path: Path) -> Conversation:
        """Rebuild a conversation from its transcript; a torn last line (a crash mid-write) is skipped."""
        conv = cls(path.stem, path)
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            conv._apply(rec)
        last = conv.messages[-1] if conv.messages else None
        if last is not None and last.role == "assistant" and not last.done:
            last.done, last.error = True, last.error or "interrupted"
        return conv

    def _apply(self, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "meta":
            self.title = rec.get("title") or self.title
        elif kind == "user":
            content = rec.get("content", "")
            self.title = self.title or _title(content)
            self.messages.append(Message("user", content))
        elif kind == "delta":
            reply = self._open_reply()
            reply.content += rec.get("content", "")
        elif kind == "end":
            reply = self._open_reply()
            reply.done, reply.stats, reply.error = True, rec.get("stats"), rec.get("error")

    def _open_reply(self) -> Message:
        if not self.messages or self.messages[-1].role != "assistant" or self.messages[-1].done:
            self.messages.append(Message("assistant", "", done=False))
        return self.messages[-1]

    # -- recording (each call writes one line and flushes) -----------------------------------------
    def _write(self, rec: dict[str, Any]) -> None:
        if self._file is None or self._file.closed:
            self._file = _open_private(self.path, os.O_APPEND)
        self._file.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._file.flush()

    def add_user(self, content: str) -> None:
        """Record the user's message (before it is sent) and drop the draft."""
        self.title = self.title or _title(content)
        self.messages.append(Message("user", content))
        self._write({"type": "user", "time": time.time(), "content": content})
        self.save_draft("")

    def add_delta(self, piece: str) -> None:
        """Record one piece of the streaming reply."""
        self._open_reply().content += piece
        self._write({"type": "delta", "content": piece})

    def end_reply(self, stats: dict[str, Any] | None = None, error: str | None = None) -> None:
        """Close the streaming reply, with its stats or the reason it stopped."""
        reply = self._open_reply()
        reply.done, reply.stats, reply.error = True, stats, error
        rec: dict[str, Any] = {"type": "end", "time": time.time()}
        if stats is not None:
            rec["stats"] = stats
        if error is not None:
            rec["error"] = error
        self._write(rec)

    @property
    def draft_path(self) -> Path:
        """The file holding the text typed but not yet sent."""
        return self.path.with_suffix(".draft")

    def save_draft(self, text: str) -> None:
        """Keep what is typed but not sent; replaced atomically so a crash leaves old or new, not half."""
        if not text:
            self.draft_path.unlink(missing_ok=True)
            return
        tmp = self.draft_path.with_suffix(".draft.tmp")
        with _open_private(tmp, os.O_TRUNC) as f:
            f.write(text)
        os.replace(tmp, self.draft_path)

    def history(self) -> list[dict[str, str]]:
        """The messages to send with the next request; a reply that failed is left out (the model
        would otherwise continue from a cut-off answer)."""
        return [{"role": m.role, "content": m.content} for m in self.messages
                if m.role == "user" or (m.done and m.error is None and m.content)]

    def close(self) -> None:
        """Close the transcript file (it can still be appended to later; it reopens)."""
        if self._file is not None and not self._file.closed:
            self._file.close()

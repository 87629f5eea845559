"""Transcripts: written line by line as the chat happens; a crash mid-reply loses nothing before it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kafila.session.terminal import transcripts
from kafila.session.terminal.transcripts import Conversation, chats_dir

pytestmark = pytest.mark.fast


def test_data_dir_override(data_dir: Path) -> None:
    assert chats_dir() == data_dir / "chats"


def test_default_data_dir_is_platform_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    from platformdirs import user_data_dir

    monkeypatch.delenv("KAFILA_DATA_DIR")
    assert transcripts.data_dir() == Path(user_data_dir("kafila"))


def test_round_trip_and_flush_per_line() -> None:
    conv = Conversation.create(api="http://x")
    conv.add_user("hello there")
    # Already on disk before any reply: a session that dies now loses nothing typed.
    assert "hello there" in conv.path.read_text()
    conv.add_delta("Hi")
    conv.add_delta(" you")
    conv.end_reply(stats={"tokens_per_s": 3.0})
    conv.add_user("again")
    conv.add_delta("part")
    conv.end_reply(error="member lost")
    conv.close()
    back = Conversation.load(conv.path)
    assert back.title == "hello there"
    assert [(m.role, m.content) for m in back.messages] == [
        ("user", "hello there"), ("assistant", "Hi you"), ("user", "again"), ("assistant", "part")]
    assert back.messages[1].stats == {"tokens_per_s": 3.0} and back.messages[3].error == "member lost"
    assert back.history() == [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "Hi you"},
                              {"role": "user", "content": "again"}]


def test_crash_mid_reply_keeps_partial_reply_and_skips_torn_line() -> None:
    conv = Conversation.create()
    conv.add_user("q")
    conv.add_delta("half an ans")
    conv.close()
    with conv.path.open("a") as f:
        f.write('{"type": "delta", "cont')  # the process died mid-write
    back = Conversation.load(conv.path)
    assert back.messages[-1].content == "half an ans"
    assert back.messages[-1].done and back.messages[-1].error == "interrupted"


def test_two_conversations_same_second_are_distinct() -> None:
    a, b = Conversation.create(), Conversation.create()
    assert a.path != b.path and a.path.exists() and b.path.exists()
    meta = json.loads(b.path.read_text().splitlines()[0])
    assert meta["type"] == "meta" and meta["id"] == b.id


def test_draft_saved_and_cleared_on_send() -> None:
    conv = Conversation.create()
    conv.save_draft("half-typed")
    assert conv.draft_path.read_text() == "half-typed"
    conv.add_user("half-typed message")
    assert not conv.draft_path.exists()

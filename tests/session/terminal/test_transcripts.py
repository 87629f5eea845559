"""Chat transcripts are private to the user who had the conversation."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kafila.session.terminal.transcripts import Conversation

pytestmark = pytest.mark.fast


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_transcripts_and_drafts_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which leaves new files readable by everyone
    try:
        chats = tmp_path / "data" / "chats"
        conv = Conversation.create(chats)
        conv.add_user("a secret plan")
        conv.save_draft("half a sentence")
        conv.close()
        conv.add_delta("reopened for a late reply")  # the file is opened again to append
        conv.close()
    finally:
        os.umask(old)
    assert mode(chats) == 0o700
    assert mode(conv.path) == 0o600 and mode(conv.draft_path) == 0o600
    assert Conversation.load(conv.path).messages[0].content == "a secret plan"


def test_an_older_open_directory_is_tightened(tmp_path: Path) -> None:
    chats = tmp_path / "chats"
    chats.mkdir(mode=0o755)
    os.chmod(chats, 0o755)
    Conversation.create(chats).close()
    assert mode(chats) == 0o700


def test_a_transcript_deleted_mid_conversation_comes_back_private(tmp_path: Path) -> None:
    conv = Conversation.create(tmp_path / "chats")
    conv.close()
    conv.path.unlink()
    conv.add_user("hello again")
    conv.close()
    assert mode(conv.path) == 0o600

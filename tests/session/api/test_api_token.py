"""The token file's guards (issue 34's untested guards): a token directory that is another user's, or a link,
is refused; one others can enter is made private; a token file is created without following a planted link;
a server removes only its own token; a runtime directory that cannot be used is a clear error."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from kafila.errors import SessionError
from kafila.session.api.token import own_session_url, read_token, remove_token, token_dir, token_path, write_token

pytestmark = pytest.mark.fast


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime directory of the test's own (platformdirs reads XDG_RUNTIME_DIR at each call)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("KAFILA_API_TOKEN", raising=False)
    (tmp_path / "run").mkdir(mode=0o700)
    assert token_dir() == tmp_path / "run" / "kafila"
    return token_dir()


def test_a_token_directory_others_can_enter_is_made_private(runtime: Path) -> None:
    runtime.mkdir(mode=0o755)
    runtime.chmod(0o755)
    path = write_token(8711, "t1")
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_token_directory_that_is_a_link_is_refused(runtime: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    runtime.symlink_to(elsewhere)
    with pytest.raises(SessionError, match="is not a directory of this user; the API token cannot be kept there"):
        write_token(8711, "t1")
    assert not list(elsewhere.iterdir())


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_token_directory_is_refused(runtime: Path) -> None:
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 12345, 12345)
    with pytest.raises(SessionError, match="is not a directory of this user"):
        write_token(8711, "t1")


def test_a_link_planted_as_the_token_file_is_not_followed(runtime: Path, tmp_path: Path) -> None:
    runtime.mkdir(mode=0o700)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    token_path(8711).symlink_to(target)
    path = write_token(8711, "t1")
    assert target.read_text() == "precious\n" and not path.is_symlink() and path.read_text() == "t1\n"


def test_a_server_removes_only_its_own_token(runtime: Path) -> None:
    first = write_token(8711, "first")
    later = write_token(8711, "second")  # another process serving on the same port since
    remove_token(first, "first")
    assert later.exists() and read_token("http://127.0.0.1:8711") == "second"
    remove_token(later, "second")
    assert not later.exists() and read_token("http://127.0.0.1:8711") is None


def test_a_runtime_directory_another_user_made_first_is_a_clear_error(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # XDG_RUNTIME_DIR unusable, and its fallback in /tmp planted first (a link here): host and join died at
    # start with platformdirs' PermissionError
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(blocked))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / f"runtime-{os.getuid()}").symlink_to(tmp_path)
    with pytest.raises(SessionError, match=r"no private runtime directory for the chat API's token .*; set "
                                           r"XDG_RUNTIME_DIR to a directory only you can use \(mode 0700\)"):
        write_token(8711, "t1")


def test_a_client_finds_the_session_that_moved_off_a_taken_port(runtime: Path) -> None:
    # issue 34 item 5: a session that found 8711 taken serves on 8712; `kafila chat` kept talking to 8711
    default = "http://127.0.0.1:8711"
    assert own_session_url(default) == default  # no session of ours anywhere: the default (and its error)
    older = write_token(8713, "older")
    os.utime(older, (1, 1))
    write_token(8712, "moved")
    assert own_session_url(default) == "http://127.0.0.1:8712"  # the newest session of ours
    write_token(8711, "here")
    assert own_session_url(default) == default

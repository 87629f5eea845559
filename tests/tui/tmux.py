"""Drive a real terminal: a program in a private tmux server, keys in with send-keys, the screen out with
capture-pane."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class Tmux:
    """One tmux session on its own server socket (never the user's), killed on close."""

    def __init__(self, name: str) -> None:
        if shutil.which("tmux") is None:
            raise FileNotFoundError("tmux")
        self.socket = f"kafila-test-{os.getpid()}-{name}"
        self.name = name

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        return out.stdout

    def start(self, command: str, cwd: Path, env: dict[str, str], width: int = 80, height: int = 24) -> None:
        """Run `command` in a width×height terminal; the shell stays 60 s after it ends (to read EXIT=)."""
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"cd {shlex.quote(str(cwd))} && env {exports} {command}; echo EXIT=$?; sleep 60"
        subprocess.run(["tmux", "-L", self.socket, "new-session", "-d", "-s", self.name, "-x", str(width),
                        "-y", str(height), shell], check=True, timeout=30,
                       env={**os.environ, "TERM": "xterm-256color"})

    def keys(self, *keys: str) -> None:
        """Send keys (tmux key names such as F3, C-q, Enter, or literal text)."""
        self._tmux("send-keys", "-t", self.name, *keys)

    def type(self, text: str) -> None:
        """Type literal text."""
        self._tmux("send-keys", "-t", self.name, "-l", text)

    def screen(self) -> str:
        """What the terminal shows now."""
        return self._tmux("capture-pane", "-t", self.name, "-p")

    def wait_for(self, check: Callable[[str], bool] | str, timeout: float = 30.0) -> str:
        """Poll the screen until `check` (or the text) holds; returns that screen or fails showing the last one."""
        test = (lambda s: check in s) if isinstance(check, str) else check
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = self.screen()
            if test(screen):
                return screen
            time.sleep(0.25)
        raise AssertionError(f"screen did not show the expected content in {timeout:g} s:\n{screen}")

    def close(self) -> None:
        """Kill this test's tmux server (its programs get SIGHUP)."""
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)

"""A real session on loopback for tests: `kafila rendezvous`, `kafila host` and members as separate processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kafila.net.ports import free_udp_pair

REPO = Path(__file__).resolve().parents[2]
CODE_RE = re.compile(r"join code ([a-z0-9-]+)")


class Proc:
    """A kafila process whose output is collected line by line."""

    def __init__(self, name: str, args: list[str], env: dict[str, str],
                 prefix: list[str] | None = None) -> None:
        self.name = name
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            [*(prefix or []), sys.executable, str(REPO / "kafila.py"), *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=env, cwd=REPO,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := pattern.search(line):
                    return m
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name} never printed {pattern.pattern!r}:\n{self.output}")


class Cluster:
    """rendezvous + host + members; `members` is a list of (name, extra join args)."""

    def __init__(self, tmp: Path, members: list[tuple[str, list[str]]], host_args: list[str] | None = None) -> None:
        self.trace = tmp / "head-trace.jsonl"
        self.env = {**os.environ, "KAFILA_CACHE_DIR": str(tmp / "cache"), "PYTHONUNBUFFERED": "1",
                    "COLUMNS": "400", "KAFILA_TRACE": str(self.trace)}
        # one probe for all members on this machine (as `kafila demo` does), not several at once
        from kafila.model.embedded import default_model_path
        from kafila.model.stage_cache import StageCache
        from kafila.session.measure import cached_probe

        cached_probe(default_model_path(), StageCache(tmp / "cache"))
        self.port = free_udp_pair()
        self.api_port = _free_tcp_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.rdv = f"127.0.0.1:{self.port}"
        self.procs: list[Proc] = [Proc("rendezvous", ["rendezvous", "--host", "127.0.0.1", "--port", str(self.port)],
                                       self.env)]
        time.sleep(0.5)
        self.host = Proc("host", ["host", "--rendezvous", self.rdv, "--members", str(len(members)),
                                  "--api-port", str(self.api_port), "--context", "512", "--wait", "300",
                                  *(host_args or [])], self.env)
        self.procs.append(self.host)
        self.code = self.host.wait_for(CODE_RE, 60).group(1)
        self.members = {name: Proc(name, ["join", self.code, "--rendezvous", self.rdv, "--name", name,
                                          "--api-port", "-1", *args], self.env) for name, args in members}
        self.procs += self.members.values()

    def headers(self) -> dict[str, str]:
        """What the host's API asks of a client: JSON, and the bearer token from the host's token file."""
        from kafila.session.api_token import read_token

        return {"Content-Type": "application/json", "Authorization": f"Bearer {read_token(self.url)}"}

    def state(self) -> dict[str, Any]:
        req = urllib.request.Request(self.url + "/kafila/state", headers=self.headers())
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def wait_phase(self, phases: set[str], timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.state()
                if last["phase"] in phases:
                    return last
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.host.popen.poll() is not None:
                    break
            time.sleep(0.3)
        raise AssertionError(f"phase never became {phases} (last {last and last['phase']}):\n{self.host.output}")

    def chat(self, content: str, max_tokens: int = 24, temperature: float = 0.0, timeout: float = 120) -> dict:
        body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                           "temperature": temperature}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", body, self.headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def stream_chat(self, content: str, max_tokens: int, timeout: float = 300) -> list[tuple[float, Any]]:
        """A streamed chat: (monotonic time it arrived, parsed chunk or "[DONE]") for every data line."""
        body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                           "temperature": 0.0, "stream": True}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", body, self.headers())
        out: list[tuple[float, Any]] = []
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    data = line[5:].strip()
                    out.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))
        return out

    def stop(self, timeout: float = 20) -> list[str]:
        """Stop everything; returns the names of processes that had to be killed (hung)."""
        hung = []
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(p.name)
                p.popen.kill()
                p.popen.wait()
        return hung


def _free_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

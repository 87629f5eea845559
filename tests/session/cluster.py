"""A real session on loopback for tests: `kafila rendezvous`, `kafila host` and members as separate processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafila.net.ports import free_udp_pair
from kafila.session.options import HostOptions, MemberOptions
from tests.shared_probe import shared_probe

REPO = Path(__file__).resolve().parents[2]
CODE_RE = re.compile(r"join code ([a-z0-9-]+)")
LISTENING_RE = re.compile(r"rendezvous listening on")
API_RE = re.compile(r"the chat API serves on (http://\S+)")
PORT_TRIES = 5
HOST_MEMBER = "hal"  # the serving host's name as a ring member
STOPPED_STATUSES = (0, 130)  # ended by itself, or stopped cleanly by SIGTERM ("kafila: interrupted")
# How long a reply may take before a test calls it a hang: a bound on a hang, not a speed check. On a
# machine shared by several test runs (load 20 on 2 cores) one 24-token reply through a three-member
# ring took 255 s and four concurrent ones 890 s (the ring advancing all the while); alone, seconds.
REPLY_TIMEOUT_S = 1800


# A process killed with kill -9 says nothing: its neighbours notice it by the QUIC link's idle timeout
# (kafila.session.options, 5 s), whose timer runs from the last packet heard from it, so from at most the
# kill. A test bounds the time from the kill to the loss's notice reaching its client by that timeout and
# LOSS_MARGIN_TIMEOUTS more of it, the margin a loaded machine needs: aioquic stretches the idle timeout
# to three probe timeouts when round trips grow, and the report then crosses two or three busy processes
# (the member's report, the host's or the head's API, the HTTP stream, the client's reader thread). A loss
# noticed by anything slower than its timeout (a timer that did not fire, a later request) misses it.
LINK_IDLE_TIMEOUT_S = max(MemberOptions.link_idle_timeout_s, HostOptions.link_idle_timeout_s)
LOSS_MARGIN_TIMEOUTS = 3
LOSS_NOTICED_WITHIN_S = (1 + LOSS_MARGIN_TIMEOUTS) * LINK_IDLE_TIMEOUT_S


def lab_env(tmp: Path) -> dict[str, str]:
    """The environment of a NAT-lab test's processes: the test's own cache and its own runtime directory.

    Every lab's host serves its API on the same port in its own namespace, and the API's token file is named
    by the port alone: in a shared runtime directory another test run's host would replace this one's token.
    """
    runtime = tmp / "runtime"
    runtime.mkdir(mode=0o700)
    return {**os.environ, "KAFILA_CACHE_DIR": str(tmp / "cache"), "XDG_RUNTIME_DIR": str(runtime),
            "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}


class Proc:
    """A kafila process whose output is collected line by line."""

    def __init__(self, name: str, args: list[str], env: dict[str, str],
                 prefix: list[str] | None = None, script: str | None = None) -> None:
        self.name = name
        self.lines: list[str] = []
        # `script`: Python run with -c in place of kafila.py (it calls kafila.cli.main itself, after a patch)
        program = ["-c", script] if script is not None else [str(REPO / "kafila.py")]
        self.popen = subprocess.Popen(
            [*(prefix or []), sys.executable, *program, *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=env, cwd=REPO,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def settled_output(self, timeout: float = 30) -> str:
        """Its output once the pipe is empty and the reader has taken every line (call it stopped: SIGSTOP).

        What a stopped process printed just before may still be in the pipe or the reader's hands: a check
        of `output` alone could miss a line that is already written."""
        assert self.popen.stdout is not None
        deadline, seen = time.monotonic() + timeout, -1
        while time.monotonic() < deadline:
            waiting = struct.unpack("i", fcntl.ioctl(self.popen.stdout.fileno(), termios.FIONREAD, b"\0" * 4))[0]
            if waiting == 0 and len(self.lines) == seen:  # nothing in the pipe, and no line taken in 50 ms
                return self.output
            seen = len(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"{self.name}'s output never settled")

    def stop_now(self, timeout: float = 30) -> None:
        """SIGSTOP it, and return once every thread has stopped: a thread inside a long system call (a write of
        megabytes) finishes that call first, so the signal's return alone does not mean the process stands."""
        os.kill(self.popen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for stat in Path(f"/proc/{self.popen.pid}/task").glob("*/stat"):
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            if states and all(s == "T" for s in states):
                return
            time.sleep(0.001)
        raise AssertionError(f"{self.name} did not stop within {timeout} s of SIGSTOP")

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        if m := self.wait_for_either(pattern, timeout):
            return m
        raise AssertionError(f"{self.name} never printed {pattern.pattern!r}:\n{self.output}")

    def wait_for_either(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str] | None:
        """The first line matching `pattern`; None once the process has ended (or `timeout` passed) without it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := pattern.search(line):
                    return m
            if self.popen.poll() is not None:
                self.reader.join(5)  # its last lines may still be in the pipe
                return next((m for line in self.lines if (m := pattern.search(line))), None)
            time.sleep(0.05)
        return None


class Cluster:
    """rendezvous + host + members; `members` is a list of (name, extra join args).

    `member_env` adds environment variables for some members (e.g. a cache of their own); `member_prefix`
    runs some members under a command (e.g. in a mount namespace with a small filesystem); `scripts` runs
    the named members with -c SCRIPT in place of kafila.py. The host only coordinates unless `serve_host`
    (then its machine is a member too, named HOST_MEMBER).
    """

    def __init__(self, tmp: Path, members: list[tuple[str, list[str]]], host_args: list[str] | None = None,
                 member_env: dict[str, dict[str, str]] | None = None,
                 member_prefix: dict[str, list[str]] | None = None,
                 scripts: dict[str, str] | None = None, serve_host: bool = False) -> None:
        self.scripts = scripts or {}
        self.serve_host = serve_host
        self.trace = tmp / "head-trace.jsonl"
        self.env = {**os.environ, "KAFILA_CACHE_DIR": str(tmp / "cache"), "PYTHONUNBUFFERED": "1",
                    "COLUMNS": "400", "KAFILA_TRACE": str(self.trace),
                    # each process watches the test's: a killed test run (a timeout, a loop stopped) leaves none running
                    "KAFILA_PARENT_PID": str(os.getpid())}
        shared_probe(tmp / "cache")
        self.procs: list[Proc] = []
        self.member_env = member_env or {}
        self.member_prefix = member_prefix or {}
        try:
            self._start(members, host_args or [])
        except BaseException:
            self.stop()  # whatever did start must not outlive the failed start
            raise

    def _start(self, members: list[tuple[str, list[str]]], host_args: list[str]) -> None:
        # A port picked here may be taken by another process before ours binds it: start again on a new one.
        for _ in range(PORT_TRIES):
            self.port = free_udp_pair()
            rdv = Proc("rendezvous", ["rendezvous", "--host", "127.0.0.1", "--port", str(self.port)], self.env)
            if rdv.wait_for_either(LISTENING_RE, 60):
                break
            self._drop(rdv)
        else:
            raise AssertionError(f"the rendezvous never listened:\n{rdv.output}")
        self.procs.append(rdv)
        self.rdv = f"127.0.0.1:{self.port}"
        for _ in range(PORT_TRIES):
            self.api_port = _free_tcp_port()
            role = ["--name", HOST_MEMBER] if self.serve_host else ["--coordinate-only"]
            self.host = Proc("host", ["host", "--rendezvous", self.rdv, "--members", str(len(members)),
                                      "--api-port", str(self.api_port), "--context", "512", "--wait", "300",
                                      *role, *host_args], self.env)
            # the port asked may be taken meanwhile: the host then serves on another and says which
            if (m := self.host.wait_for_either(CODE_RE, 60)) and (api := self.host.wait_for_either(API_RE, 60)):
                self.url = api.group(1)
                if self._api_answers(m.group(1)):
                    break
            self._drop(self.host)
        else:
            raise AssertionError(f"the host never served its API:\n{self.host.output}")
        self.procs.append(self.host)
        self.code = m.group(1)
        self.members = {name: Proc(name, ["join", self.code, "--rendezvous", self.rdv, "--name", name,
                                          "--api-port", "-1", *args], {**self.env, **self.member_env.get(name, {})},
                                     self.member_prefix.get(name), script=self.scripts.get(name))
                        for name, args in members}
        self.procs += self.members.values()

    def join(self, name: str, args: list[str] | None = None) -> Proc:
        """Start one more member, joining the session now (a friend arriving late)."""
        proc = Proc(name, ["join", self.code, "--rendezvous", self.rdv, "--name", name, "--api-port", "-1",
                           *(args or [])], {**self.env, **self.member_env.get(name, {})})
        self.members[name] = proc
        self.procs.append(proc)
        return proc

    def headers(self, url: str | None = None) -> dict[str, str]:
        """What an API asks of a client (the host's, or the one at `url`): JSON, and the bearer token from its file."""
        from kafila.session.api.token import read_token

        return {"Content-Type": "application/json", "Authorization": f"Bearer {read_token(url or self.url)}"}

    def member_url(self, name: str, timeout: float = 240) -> str:
        """Where member `name` serves its chat API (it was started with --api-port)."""
        return self.members[name].wait_for(API_RE, timeout).group(1)

    def _api_answers(self, code: str) -> bool:
        """Whether our host serves the API on the port asked (not another process, and not failed to bind)."""
        while self.host.popen.poll() is None:
            try:
                # the API redacts the code (null); a code that is there and differs is another session's host
                return self.state().get("code") in (None, code)
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        return False

    @staticmethod
    def _drop(proc: Proc) -> None:
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait()

    def state(self, url: str | None = None) -> dict[str, Any]:
        """/kafila/state of the host's API, or of the API at `url` (a member's)."""
        url = url or self.url
        req = urllib.request.Request(url + "/kafila/state", headers=self.headers(url))
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

    def wait_state(self, url: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """Poll the `/kafila/state` at url until done(state) holds."""
        deadline = time.monotonic() + timeout
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                state = self.state(url)
            except (urllib.error.URLError, ConnectionError, OSError):  # a busy API past urlopen's 10 s: ask again
                time.sleep(0.2)
                continue
            if done(state):
                return state
            time.sleep(0.2)
        raise AssertionError(f"the state at {url} never got there: {state}")

    def chat(self, content: str, max_tokens: int = 24, temperature: float = 0.0,
             timeout: float = REPLY_TIMEOUT_S,
             url: str | None = None) -> dict:
        """A chat through the host's API, or through the one at `url`.

        With `cache_prompt: false`, as every helper here sends: the prompt is computed afresh, so a greedy
        reply is comparable with llama.cpp's own (a reused cache was computed in other batches).
        """
        url = url or self.url
        body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                           "temperature": temperature, "cache_prompt": False}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", body, self.headers(url))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def stream_chat(self, content: str, max_tokens: int, timeout: float = REPLY_TIMEOUT_S,
                    streaming: threading.Event | None = None, url: str | None = None,
                    prefilling: threading.Event | None = None, streaming_after: int = 1,
                    extra: dict[str, Any] | None = None) -> list[tuple[float, Any]]:
        """A streamed chat: (monotonic time it arrived, parsed chunk or "[DONE]") for every data line.

        `streaming` is set once `streaming_after` characters of the reply's text have arrived, `prefilling`
        once the first prefill progress chunk has. Through the host's API, or the one at `url`; `extra`: more
        body fields (greedy unless they say otherwise).
        """
        text = 0
        url = url or self.url
        body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                           "temperature": 0.0, "stream": True, "cache_prompt": False, **(extra or {})}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", body, self.headers(url))
        out: list[tuple[float, Any]] = []
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    data = line[5:].strip()
                    out.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))
                    chunk = out[-1][1]
                    if prefilling is not None and chunk != "[DONE]" and "progress" in (chunk.get("kafila") or {}):
                        prefilling.set()
                    if chunk != "[DONE]":
                        text += sum(len(c.get("delta", {}).get("content") or "") for c in chunk.get("choices", []))
                    if streaming is not None and text >= streaming_after:
                        streaming.set()
        return out

    def stop(self, timeout: float = 30) -> list[str]:
        """Stop every process still running; returns what went wrong with each stop (empty: all clean).

        A clean stop exits 0 or 130 by itself. The CLI's own deadline (15 s, then status 1 with every
        thread's stack) ends a stuck stop, so a stop is checked by status and output, not only by time.
        """
        running = [p for p in self.procs if p.popen.poll() is None]
        for p in reversed(running):
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        problems = []
        for p in running:
            try:
                status = p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
                problems.append(f"{p.name} still running {timeout:.0f} s after SIGTERM")
                continue
            p.reader.join(5)
            if status not in STOPPED_STATUSES or "stopping took over" in p.output:
                problems.append(f"{p.name} stopped with status {status}:\n{p.output[-3000:]}")
        return problems

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, _tb: object) -> None:
        """Stop everything; an unclean stop fails the test, but never hides the test's own error."""
        problems = self.stop()
        if exc is not None:
            for problem in problems:
                exc.add_note(f"also, on stopping: {problem}")
        elif problems:
            raise AssertionError("unclean stop:\n" + "\n".join(problems))


def reply_text(chunks: list[tuple[float, Any]]) -> str:
    """The text of a streamed reply (Cluster.stream_chat's chunks), which must have ended whole, with no error."""
    assert chunks[-1][1] == "[DONE]" and not any("error" in c for _, c in chunks[:-1]), chunks[-3:]
    return "".join(ch["delta"].get("content") or "" for _, c in chunks[:-1] for ch in c.get("choices", []))


class BackToBack:
    """Replies to one prompt streamed one after another in a thread until the block ends: a ring that is always
    decoding (`streaming` is set once the first has `streaming_after` characters of text)."""

    def __init__(self, cluster: Cluster, content: str, max_tokens: int, streaming_after: int = 1) -> None:
        self.replies: list[list[tuple[float, Any]]] = []
        self.streaming = threading.Event()
        self._cluster = cluster
        self._stop = threading.Event()

        def decode() -> None:
            while not self._stop.is_set():
                self.replies.append(cluster.stream_chat(content, max_tokens, REPLY_TIMEOUT_S, self.streaming,
                                                        streaming_after=streaming_after))

        self._worker = threading.Thread(target=decode)

    def __enter__(self) -> BackToBack:
        self._worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._worker.join(REPLY_TIMEOUT_S)

    def more(self, n: int, timeout: float = REPLY_TIMEOUT_S) -> None:
        """Until `n` more replies have ended than now."""
        target, deadline = len(self.replies) + n, time.monotonic() + timeout
        while len(self.replies) < target and self._worker.is_alive():
            if time.monotonic() >= deadline:  # what each process last said: a ring stuck, or only slow?
                said = [f"--- {p.name}:\n{p.output[-1500:]}" for p in self._cluster.procs]
                raise AssertionError("\n".join([f"fewer than {n} more replies within {timeout:.0f} s", *said]))
            time.sleep(0.2)


DRIFT_NOTICE = re.compile(r"the ring is planned again: \S+ runs [\d.]+× (slower|faster) than planned")


def check_resumed_reply(chunks: list[tuple[float, Any]], killed_at: float, reference: str | None,
                        context: Any, lost: str | None = None) -> str:
    """Check a streamed reply (Cluster.stream_chat's chunks) that a loss at `killed_at` cut and the ring resumed.

    It ends whole (no error), holds one notice of the loss, which reached the client within
    LOSS_NOTICED_WITHIN_S of the kill, and its text is exactly `reference`, before the notice and after it
    (the reply is rebuilt in the chunks it was computed in; None: some text on each side of it). `context`
    joins the first check's message (the processes' output). Returns the notice.

    Any other notice must be a drift's re-plan: beside a load on both cores a member was seen running 2x
    slower than planned for 30 s after the re-plan, and the ring was rightly planned around it (the reply
    then resumes once more, with the same tokens). A drift's re-plan begun within the loss's timeout (the
    kill not noticed yet) cuts the reply itself, and plans the ring without the member it then finds gone:
    its notice is then the one after the kill, and the caller checks the new plan left the member out. With
    `lost`, the notice must name that member unless it is such a drift's.
    """
    shown = "\n".join(f"--- {k}:\n{v}" for k, v in context.items()) if isinstance(context, dict) else context
    errors = [c["error"] for _, c in chunks[:-1] if "error" in c]
    assert chunks[-1][1] == "[DONE]" and not errors, f"errors: {errors}\n{shown}"
    every = [(t, c["kafila"]["notice"]) for t, c in chunks[:-1] if "notice" in c.get("kafila", {})]
    notices = ([(t, n) for t, n in every if not DRIFT_NOTICE.search(n)]
               or [(t, n) for t, n in every if t > killed_at][:1])
    assert len(notices) == 1, f"notices: {every}\n{shown}"
    noticed_at, notice = notices[0]
    assert noticed_at - killed_at < LOSS_NOTICED_WITHIN_S, (notice, noticed_at - killed_at)
    assert lost is None or lost in notice or DRIFT_NOTICE.search(notice), notice
    pieces = [(t, ch["delta"].get("content", "")) for t, c in chunks[:-1] for ch in c.get("choices", [])]
    before = "".join(p for t, p in pieces if t < noticed_at)
    after = "".join(p for t, p in pieces if t > noticed_at)
    assert before and after.strip(), (before, after)
    assert reference is None or before + after == reference, (before, after, reference)
    return str(notice)


def _free_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""Two dashboards on one machine, in real terminals (tmux): `kafila tui --host` and `kafila tui --join CODE`,
sharing the user's data directory and asked for the same chat API port. Both reach admission, a chat typed
into each gets llama.cpp's greedy reply, the second API says where it moved, and nothing is left running
once both are quit."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafila.net.ports import free_udp_pair
from kafila.session.api.token import read_token
from tests.conftest import REPO, llama_cpp_reply, missing_tool
from tests.session.cluster import LISTENING_RE, PORT_TRIES, Proc, _free_tcp_port
from tests.shared_probe import shared_probe
from tests.tui.tmux import Tmux

KAFILA = f"{sys.executable} kafila.py"
PROMPTS = {"host": "What is the capital of France?", "join": "What is the capital of Italy?"}
MAX_TOKENS = 10
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a whole session of processes on a loaded machine
CODE_ON_SCREEN = re.compile(r"code ([a-z0-9]{8}-?[a-z0-9-]{16,})")


@pytest.fixture
def terminals(request: pytest.FixtureRequest) -> Iterator[dict[str, Tmux]]:
    made: dict[str, Tmux] = {}
    try:
        for role in PROMPTS:
            made[role] = Tmux(f"{role}{os.getpid() % 10000}")
    except FileNotFoundError:
        missing_tool("tmux is not installed (make sysdeps installs it)")
    try:
        yield made
    finally:
        for t in made.values():
            t.close()


def replies(data_dir: Path) -> dict[str, tuple[str, str]]:
    """Each finished conversation's first prompt → (the API it went to, the reply)."""
    out: dict[str, tuple[str, str]] = {}
    for f in (data_dir / "chats").glob("*.jsonl"):
        api, prompt, text = "", "", ""
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "meta":
                api = rec["api"]
            elif rec["type"] == "user":
                prompt = rec["content"]
            elif rec["type"] == "delta":
                text += rec["content"]
            elif rec["type"] == "end" and prompt:
                out[prompt] = (api, text if "error" not in rec else f"ERROR {rec['error']}")
    return out


def ours_running(marker: str) -> list[str]:
    """Kafila processes of this machine whose arguments mention `marker` (the test's rendezvous address).

    Python running kafila.py only: the terminals' shells (and tmux) mention it too, and stay a while.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "python" in Path(argv[0]).name and any(a.endswith("kafila.py") for a in argv[1:2]) and any(
                    marker in a for a in argv):
                found.append(f"{proc.name}: {' '.join(argv)}")
    return found


def test_host_and_join_dashboards_on_one_machine_both_chat(terminals: dict[str, Tmux], tmp_path: Path,
                                                           smollm: Path) -> None:
    truth = {role: llama_cpp_reply(smollm, prompt, MAX_TOKENS) for role, prompt in PROMPTS.items()}
    data_dir = tmp_path / "data"  # one user: one data directory for both dashboards
    env = {"KAFILA_CACHE_DIR": str(tmp_path / "cache"), "KAFILA_DATA_DIR": str(data_dir)}
    shared_probe(tmp_path / "cache")
    for _ in range(PORT_TRIES):
        port = free_udp_pair()
        rdv = Proc("rendezvous", ["rendezvous", "--host", "127.0.0.1", "--port", str(port)],
                   {**os.environ, **env, "PYTHONUNBUFFERED": "1"})
        if rdv.wait_for_either(LISTENING_RE, 60):
            break
        rdv.popen.kill()
        rdv.popen.wait()
    address = f"127.0.0.1:{port}"
    api_port = _free_tcp_port()  # both dashboards ask for it: the second must move to the next free one
    common = f"--rendezvous {address} --api-port {api_port} --context 512 --max-tokens {MAX_TOKENS} --temperature 0"
    try:
        host, join = terminals["host"], terminals["join"]
        host.start(f"{KAFILA} tui --host --members 1 {common}", REPO, env, width=220, height=50)
        code = CODE_ON_SCREEN.search(host.wait_for(lambda s: CODE_ON_SCREEN.search(s) is not None, 240)).group(1)
        join.start(f"{KAFILA} tui --join {code} --name ana {common}", REPO, env, width=220, height=50)
        for t in (host, join):
            t.wait_for(lambda s: "ADMITTED" in s or "REJECTED" in s or "LOST" in s or "EXIT=" in s, 480)
            t.wait_for("Admitted: the ring serves", 30)  # the chat opened itself
        # one chat after the other: two at once share the ring's frames, and llama.cpp's numbers move with the
        # rows per call, so concurrent greedy replies need not equal each one alone (README, batching)
        for n, (role, t) in enumerate(terminals.items(), 1):
            t.type(PROMPTS[role])
            t.keys("Enter")
            deadline = time.monotonic() + 300
            while len(got := replies(data_dir)) < n:
                assert time.monotonic() < deadline, f"replies so far {got}:\n{host.screen()}\n{join.screen()}"
                time.sleep(0.5)
        apis = {role: got[PROMPTS[role]][0] for role in PROMPTS}
        for role in PROMPTS:
            assert got[PROMPTS[role]][1].strip() == truth[role].strip(), (role, got)
        # each dashboard chatted through its own process's API: the host's on the port asked, the other moved
        assert apis["host"] == f"http://127.0.0.1:{api_port}" and apis["join"] != apis["host"], apis
        moved = f"port {api_port} is in use: the chat API serves on {apis['join']} instead"
        req_state = _state(apis["join"])
        assert req_state["me"] == "ana" and any(moved in text for _, text in req_state["events"]), req_state["events"]
        for role, t in terminals.items():
            words = " ".join(truth[role].split()[:2])
            assert words in " ".join(t.screen().split()), (role, t.screen())  # the reply is on each screen
        for t in (join, host):
            t.keys("C-q")
            t.wait_for("EXIT=0", 60)
    finally:
        if rdv.popen.poll() is None:
            rdv.popen.terminate()
            rdv.popen.wait(30)
    deadline = time.monotonic() + 30
    while left := ours_running(address):
        assert time.monotonic() < deadline, f"still running after both dashboards quit: {left}"
        time.sleep(0.5)


def _state(url: str) -> dict:
    import urllib.request

    req = urllib.request.Request(url + "/kafila/state", headers={"Authorization": f"Bearer {read_token(url)}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())

"""The dashboard in a real terminal (tmux): the replayed recording of a real demo run, the terminal guard,
and the acceptance run of `kafila tui --demo` with a prompt typed in and the reply read off the screen."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, llama_cpp_reply, missing_tool
from tests.session.cluster import REPLY_TIMEOUT_S
from tests.tui.demo_cache import assert_demo_ran_in, probe_files
from tests.tui.tmux import Tmux

pytestmark = pytest.mark.slow

KAFILA = f"{sys.executable} kafila.py"
RECORDED = REPO / "tests" / "tui" / "data" / "demo-admitted.json"  # `kafila tui --demo --record` on a real run


@pytest.fixture
def tmux(request: pytest.FixtureRequest) -> Iterator[Tmux]:
    try:
        t = Tmux(request.node.name[:20])
    except FileNotFoundError:
        missing_tool("tmux is not installed (make sysdeps installs it)")
    try:
        yield t
    finally:
        t.close()


def test_replay_of_a_real_run_in_a_terminal(tmux: Tmux, data_dir: Path) -> None:
    tmux.start(f"{KAFILA} tui --replay {RECORDED}", REPO, {"KAFILA_DATA_DIR": str(data_dir)})
    screen = tmux.wait_for("ADMITTED")
    assert "Admitted: the ring serves" in screen  # an admitted session opens the chat
    tmux.keys("F3")
    screen = tmux.wait_for("strategies side by side")
    assert "(head)" in screen and "◀" in screen
    tmux.keys("F2")
    screen = tmux.wait_for("ring edges, verified with real packets")
    assert "1→2" in screen and "✓" in screen
    tmux.keys("F1")
    screen = tmux.wait_for("EMU")
    tmux.keys("C-q")
    tmux.wait_for("EXIT=0")


GUARD_SCRIPT = """
import logging, os, sys
from pathlib import Path
from kafila.session.state import SessionState
from kafila.tui.app import KafilaApp
from kafila.tui.terminal import own_terminal

async def noisy(state):
    os.write(1, b"C-LEVEL-STDOUT-NOISE\\n")  # what llama.cpp's C code does
    os.write(2, b"C-LEVEL-STDERR-NOISE\\n")
    print("PRINTED-NOISE")
    logging.getLogger("kafila").warning("LOGGED-NOISE")
    state.set_phase("waiting", "noise made")
    return 0

logging.basicConfig(stream=sys.stderr)
with own_terminal(Path(sys.argv[1])):
    KafilaApp(SessionState(), flow=noisy).run()
print("BACK-ON-THE-TERMINAL")
"""


def test_nothing_but_textual_writes_to_the_terminal(tmux: Tmux, tmp_path: Path) -> None:
    script = tmp_path / "guard.py"
    script.write_text(GUARD_SCRIPT)
    log = tmp_path / "tui.log"
    tmux.start(f"{sys.executable} {script} {log}", REPO, {"PYTHONPATH": str(REPO)})
    screen = tmux.wait_for("CLOSED")  # the flow ran and returned
    assert "NOISE" not in screen
    tmux.keys("C-q")
    screen = tmux.wait_for("EXIT=0")
    assert "BACK-ON-THE-TERMINAL" in screen and "NOISE" not in screen
    text = log.read_text()
    for noise in ("C-LEVEL-STDOUT-NOISE", "C-LEVEL-STDERR-NOISE", "LOGGED-NOISE"):
        assert noise in text


def transcript_replies(data_dir: Path) -> list[str]:
    """The finished assistant replies saved under the data dir."""
    replies: list[str] = []
    for f in (data_dir / "chats").glob("*.jsonl"):
        text = ""
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "delta":
                text += rec["content"]
            elif rec["type"] == "end":
                replies.append(text)
                text = ""
    return replies


def test_demo_end_to_end_in_tmux(tmux: Tmux, data_dir: Path, demo_cache: Path, smollm: Path) -> None:
    """The real `kafila tui --demo`: rendezvous, three member processes and the host; plan, matrix, a reply.

    In the test's own cache, seeded with the shared probe: the demo neither probes nor writes the user's cache."""
    seeded = probe_files(demo_cache)
    tmux.start(f"{KAFILA} tui --demo --api-port 0 --max-tokens 12 --temperature 0", REPO,
               {"KAFILA_DATA_DIR": str(data_dir), "KAFILA_CACHE_DIR": str(demo_cache)}, width=100, height=30)
    tmux.wait_for(lambda s: "ADMITTED" in s or "REJECTED" in s or "LOST" in s, timeout=300)
    screen = tmux.wait_for("Admitted: the ring serves", timeout=10)  # the chat opened itself
    tmux.type("What is the capital of France?")
    tmux.keys("Enter")
    screen = tmux.wait_for("you  What is the capital of France?")
    end = REPLY_TIMEOUT_S  # a hang bound, not a speed check
    import time

    deadline = time.monotonic() + end
    while not transcript_replies(data_dir):
        assert time.monotonic() < deadline, f"no reply within {end:g} s:\n{tmux.screen()}"
        time.sleep(0.5)
    reply = transcript_replies(data_dir)[0].strip()
    assert reply == llama_cpp_reply(smollm, "What is the capital of France?", 12).strip()
    screen = tmux.wait_for("tok/s", timeout=10)
    first_words = " ".join(reply.split()[:2])
    assert first_words in " ".join(screen.split()), screen  # the streamed reply is on the screen
    assert "stage ms measured/predicted" in screen
    tmux.keys("F3")
    screen = tmux.wait_for("strategies side by side")
    assert "(head)" in screen and "◀" in screen and "to scale" in screen
    tmux.keys("F2")
    screen = tmux.wait_for("ring edges, verified with real packets")
    assert "predicted reachability" in screen and "direct" in screen
    tmux.keys("C-q")
    tmux.wait_for("EXIT=0", timeout=60)
    assert_demo_ran_in(demo_cache, seeded)


def test_record_writes_the_attached_sessions_last_state(tmux: Tmux, data_dir: Path, tmp_path: Path) -> None:
    """`kafila tui --attach URL --record FILE`: on exit FILE holds the state the session's real API reported."""
    from tests.tui import states
    from tests.tui.scripted_api import Script, serve_in_thread

    out = tmp_path / "recorded.json"
    served = states.admitted_state()
    served.api_url = None  # the attached dashboard fills in the URL it reached the session at
    script = Script()
    with serve_in_thread(script) as url:
        script.show(served)
        tmux.start(f"{KAFILA} tui --attach {url} --record {out}", REPO, {"KAFILA_DATA_DIR": str(data_dir)},
                   width=200, height=200)
        tmux.wait_for("ADMITTED")
        tmux.keys("C-q")
        tmux.wait_for("EXIT=0")
    recorded = json.loads(out.read_text())
    expected = {**served.to_json(), "api_url": url, "code": None}  # the API never hands out the join code
    assert recorded == expected

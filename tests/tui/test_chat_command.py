"""`kafila chat` as a user runs it: a subprocess fed on stdin, against the real API server, its ring scripted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tui.scripted_api import Script, refusing_port, serve_in_thread

pytestmark = pytest.mark.fast


def run_kafila(*args: str, input: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python kafila.py ARGS` with `input` on stdin, as a user piping into it would."""
    return subprocess.run([sys.executable, str(REPO / "kafila.py"), *args], input=input, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def transcripts(data_dir: Path) -> list[list[dict[str, object]]]:
    files = (data_dir / "chats").glob("*.jsonl")
    convs = [[json.loads(line) for line in f.read_text().splitlines()] for f in files]
    return sorted(convs, key=lambda recs: float(recs[0]["created"]))  # type: ignore[arg-type]


def test_chat_streams_keeps_history_and_saves(data_dir: Path) -> None:
    script = Script(echo=True)
    with serve_in_thread(script) as url:
        r = run_kafila("chat", "--api", url, "--temperature", "0",
                       input="hello ring\nsecond one\n/new\nthird\n/quit\n",
                       env={"KAFILA_DATA_DIR": str(data_dir)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "echo: hello ring" in r.stdout and "echo: third" in r.stdout
    assert "42.5 tok/s" in r.stdout and "network 18%" in r.stdout
    assert "alpha 4.5/4.0" in r.stdout  # measured/predicted ms per stage
    # The second request carried the first exchange; /new started afresh.
    assert [m["content"] for m in script.requests[1]["messages"]] == ["hello ring", "echo: hello ring", "second one"]
    assert [m["content"] for m in script.requests[2]["messages"]] == ["third"]
    assert script.requests[0]["temperature"] == 0.0
    saved = transcripts(data_dir)
    assert len(saved) == 2
    assert [rec["type"] for rec in saved[0]].count("user") == 2
    assert saved[1][1] == {"type": "user", "time": saved[1][1]["time"], "content": "third"}


def test_chat_unreachable_says_how_to_start_a_session(data_dir: Path) -> None:
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}"
        r = run_kafila("chat", "--api", url, input="hi\n", timeout=60)
    assert r.returncode == 1
    assert f"kafila: error: no Kafila session answers at {url}" in r.stderr
    assert "`kafila demo`, `kafila host` or `kafila join`" in r.stderr
    assert "Traceback" not in r.stderr


def test_chat_prints_a_notice_apart_from_the_reply(data_dir: Path) -> None:
    script = Script(notices={2: "member beta was lost; the reply continues"})
    with serve_in_thread(script) as url:
        r = run_kafila("chat", "--api", url, input="one\n", env={"KAFILA_DATA_DIR": str(data_dir)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Hello, ring!" in r.stdout and "member beta was lost" not in r.stdout  # the reply's text stays whole
    assert "[member beta was lost; the reply continues]" in r.stderr
    recs = transcripts(data_dir)[0]
    assert "".join(str(rec["content"]) for rec in recs if rec["type"] == "delta") == "Hello, ring!"


def test_chat_error_mid_reply_keeps_the_chat_going(data_dir: Path) -> None:
    script = Script(error_after=1, error_message="member beta lost")
    with serve_in_thread(script) as url:
        r = run_kafila("chat", "--api", url, input="one\n", env={"KAFILA_DATA_DIR": str(data_dir)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "reply failed" in r.stdout and "member beta lost" in r.stdout
    recs = transcripts(data_dir)[0]
    assert recs[-1]["type"] == "end" and "member beta lost" in str(recs[-1]["error"])
    assert {"type": "delta", "content": "Hello"} in recs


def test_chat_with_a_base_model_completes_raw_text_and_says_so_once(data_dir: Path) -> None:
    from kafila.session.api.client import RAW_TEXT_NOTICE

    script = Script(echo=True, chat_template=False)
    with serve_in_thread(script) as url:
        r = run_kafila("chat", "--api", url, "--temperature", "0", input="Once upon\nThe end\n/quit\n",
                       env={"KAFILA_DATA_DIR": str(data_dir)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "kafila> echo: Once upon" in r.stdout and "kafila> echo: The end" in r.stdout
    assert (r.stdout + r.stderr).count(RAW_TEXT_NOTICE) == 1
    assert [b.get("prompt") for b in script.requests] == [None, "Once upon", "The end"]


def test_demo_prompt_reply_completes_raw_text_for_a_base_model() -> None:
    """What `kafila demo --prompt P` prints once its ring serves: the notice first, then the completion."""
    import io

    from kafila.session.api.client import RAW_TEXT_NOTICE
    from kafila.session.terminal.report import reply_via_api

    script = Script(echo=True, chat_template=False)
    out = io.StringIO()
    with serve_in_thread(script) as url:
        text, stats = reply_via_api(url, "The capital of France is", 8, 0.0, echo=out)
    assert text == "echo: The capital of France is" and stats["tokens_per_s"] == 42.5
    assert out.getvalue() == f"[{RAW_TEXT_NOTICE}]\n{text}"
    assert script.requests[-1]["prompt"] == "The capital of France is" and script.requests[-1]["max_tokens"] == 8

"""Losses and clashes are ordinary events, with real processes on loopback: a member lost between planning
and admission makes the host plan again over the others (never an internal error); a chat API port in
use moves the API to the next free port (never ends a session)."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest

from kafila.session.api_token import read_token
from tests.session.cluster import HOST_MEMBER, Cluster

PROMPT = "What is the capital of France?"
MAX_TOKENS = 8

# `kafila join`, killed (SIGKILL, as `kill -9`) the moment the host's assignment reaches it: after
# planning, before admission.
DIES_ON_ASSIGN = """
import os, signal, sys
import kafila.session.member as member
async def die(self, msg):
    os.kill(os.getpid(), signal.SIGKILL)
member.MemberRuntime._on_assign = die
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def capital(smollm: Path) -> str:
    """Ground truth: llama-cpp-python's own greedy reply on the whole file."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()
    model = Llama(str(smollm), n_ctx=512, verbose=False)
    try:
        return str(model.create_chat_completion([{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS,
                                                temperature=0)["choices"][0]["message"]["content"])
    finally:
        model.close()


def test_member_killed_between_planning_and_admission_is_an_ordinary_loss(tmp_path: Path, capital: str) -> None:
    with Cluster(tmp_path, [("ada", []), ("bo", []), ("cy", [])], scripts={"cy": DIES_ON_ASSIGN}) as cluster:
        state = cluster.wait_phase({"admitted"})
        assert sorted(state["plan"]["order"]) == ["ada", "bo"], cluster.host.output
        assert cluster.members["cy"].popen.wait(60) == -9
        assert "member cy was lost" in cluster.host.output
        for text in ("internal error", "ExceptionGroup", "Traceback"):
            assert text not in cluster.host.output, cluster.host.output
        reply = cluster.chat(PROMPT, MAX_TOKENS)
        assert reply["choices"][0]["message"]["content"] == capital, reply


def test_a_port_in_use_moves_the_chat_api_and_says_where(tmp_path: Path) -> None:
    with socket.socket() as taken:  # another program holds the port the member asks for
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the member's --api-port comes after the cluster's own "-1", so it is the one taken
        with Cluster(tmp_path, [("ada", ["--api-port", str(port)])]) as cluster:
            ada = cluster.members["ada"]
            said = ada.wait_for(re.compile(rf"port {port} is in use: the chat API serves on (http://\S+) instead"), 240)
            url = said.group(1)
            assert url != f"http://127.0.0.1:{port}"
            req = urllib.request.Request(url + "/kafila/state", headers={"Authorization": f"Bearer {read_token(url)}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                state = json.loads(r.read())
            assert state["me"] == "ada" and state["api_url"] == url
            cluster.wait_phase({"admitted"})
            assert ada.popen.poll() is None  # the session goes on


def test_the_host_serves_a_stage_by_default(tmp_path: Path, capital: str) -> None:
    with Cluster(tmp_path, [("ada", [])], serve_host=True) as cluster:
        state = cluster.wait_phase({"admitted"})
        assert sorted(state["plan"]["order"]) == sorted(["ada", HOST_MEMBER]), cluster.host.output
        assert all(state["members"][n]["status"] == "serving" for n in ("ada", HOST_MEMBER)), state["members"]
        assert f"{HOST_MEMBER} joined" in cluster.host.output  # counted besides --members 1: 2 in all
        reply = cluster.chat(PROMPT, MAX_TOKENS)
        assert reply["choices"][0]["message"]["content"] == capital, reply
        assert set(reply["kafila"]["stages"]) == {"ada", HOST_MEMBER}

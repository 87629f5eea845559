"""The rendezvous killed mid-session (kill -9), with real processes on loopback where every edge is direct:
serving goes on, every process says the rendezvous is unreachable, nobody exits; when a rendezvous comes
back on the same address, every process registers the session with it again."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.cluster import LISTENING_RE, Cluster, Proc

PROMPT = "What is the capital of France?"
MAX_TOKENS = 8
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a whole session of processes on a loaded machine
MEMBERS = ("ada", "bo")


@pytest.fixture(scope="module")
def capital(smollm: Path) -> str:
    return llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)


def test_rendezvous_killed_with_an_all_direct_ring_serving_goes_on(tmp_path: Path, capital: str) -> None:
    with Cluster(tmp_path, [(n, ["--api-port", "0"]) for n in MEMBERS]) as cluster:
        state = cluster.wait_phase({"admitted"})
        assert state["edges"] and all(e["state"] == "direct" for e in state["edges"]), state["edges"]
        urls = {"host": cluster.url, **{n: cluster.member_url(n) for n in MEMBERS}}
        rdv = cluster.procs[0]
        rdv.popen.kill()  # kill -9
        rdv.popen.wait()
        reply = cluster.chat(PROMPT, MAX_TOKENS)  # at once: serving never waits on the rendezvous
        assert reply["choices"][0]["message"]["content"] == capital, reply
        for name, url in urls.items():  # everybody notices, and says so; the session goes on
            state = cluster.wait_state(url, lambda s: s["rendezvous_unreachable"] is not None)
            assert "unreachable" in state["rendezvous_unreachable"] and state["phase"] == "admitted", (name, state)
            assert "0 relayed link(s)" in state["rendezvous_unreachable"], state["rendezvous_unreachable"]
        for name in MEMBERS:  # the ring serves through every member's API, long after the rendezvous went
            reply = cluster.chat(PROMPT, MAX_TOKENS, url=urls[name])
            assert reply["choices"][0]["message"]["content"] == capital, (name, reply)
        assert all(p.popen.poll() is None for p in cluster.procs[1:]), "a process exited"
        # a rendezvous comes back on the same address, empty: each process creates the session there again
        # (the first) or joins it, and announces itself again
        back = Proc("rendezvous", ["rendezvous", "--host", "127.0.0.1", "--port", str(cluster.port)], cluster.env)
        cluster.procs[0] = back
        back.wait_for(LISTENING_RE, 60)
        for url in urls.values():
            cluster.wait_state(url, lambda s: s["rendezvous_unreachable"] is None)
        back.wait_for(re.compile(r"created again"), 30)
        deadline = time.monotonic() + 30
        while len(re.findall(r"member \w+ joined", back.output)) < 1 + len(MEMBERS):
            assert time.monotonic() < deadline, back.output
            time.sleep(0.2)
        for text in ("Traceback", "internal error"):
            assert all(text not in p.output for p in cluster.procs), text
        reply = cluster.chat(PROMPT, MAX_TOKENS)
        assert reply["choices"][0]["message"]["content"] == capital, reply

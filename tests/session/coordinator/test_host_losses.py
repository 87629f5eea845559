"""Losses and clashes are ordinary events, with real processes on loopback: a member lost between planning
and admission makes the host plan again over the others (never an internal error); a chat API port in
use moves the API to the next free port (never ends a session)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kafila.session.api.token import read_token
from tests.conftest import llama_cpp_reply
from tests.session.cluster import HOST_MEMBER, LOSS_NOTICED_WITHIN_S, Cluster, Proc, check_resumed_reply

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
MAX_TOKENS = 8

# `kafila join`, killed (SIGKILL, as `kill -9`) the moment the host's assignment reaches it: after
# planning, before admission.
DIES_ON_ASSIGN = """
import os, signal, sys
import kafila.session.member.runtime as member
async def die(self, msg):
    os.kill(os.getpid(), signal.SIGKILL)
member.MemberRuntime._setup = die
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def capital(smollm: Path) -> str:
    """Ground truth: llama-cpp-python's own greedy reply on the whole file."""
    return llama_cpp_reply(smollm, PROMPT, MAX_TOKENS)


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


REMEDY = "open a new session with `kafila host`"  # what the members say, since none can take the host's role over
STORY = "Tell me a long story about a dragon."


def test_coordinate_only_host_killed_after_admission_the_ring_serves_on(tmp_path: Path, capital: str) -> None:
    with Cluster(tmp_path, [(n, ["--api-port", "0"]) for n in ("ada", "bo", "cy")]) as cluster:
        plan = cluster.wait_phase({"admitted"})["plan"]
        head = plan["head"]
        other = next(n for n in plan["order"] if n != head)
        urls = {n: cluster.member_url(n) for n in plan["order"]}
        cluster.host.popen.kill()  # kill -9
        cluster.host.popen.wait()
        # asked at once, before the members can even notice: serving never waits on the host
        reply = cluster.chat(PROMPT, MAX_TOKENS, url=urls[head])
        assert reply["choices"][0]["message"]["content"] == capital, reply
        # every member says the coordinator left, and names the same successor: the head
        for name, url in urls.items():
            state = cluster.wait_state(url, lambda s: s["coordinator_left"] is not None)
            assert state["coordinator"] == head and state["phase"] == "admitted", (name, state)
            assert "the coordinator (host) left the session" in state["coordinator_left"]
            # the coordinator's state was replicated: every member of the ring, as the planner measured it
            assert all(state["members"][n]["bandwidth_bytes_per_s"] for n in plan["order"]), state["members"]
        # it keeps working once they know, along the ring too (a member forwards to the head)
        again = cluster.chat(PROMPT, 2, url=urls[other])
        assert capital.startswith(again["choices"][0]["message"]["content"]), again
        assert all(m.popen.poll() is None for m in cluster.members.values())
        # a later loss: no survivor holds the model to cut new stages, so the session ends, saying why
        cluster.members[other].popen.kill()
        for name in plan["order"]:
            if name != other:
                member = cluster.members[name]
                assert member.popen.wait(60) == 1, member.output
                member.reader.join(5)
                assert f"{other} lost" in member.output and REMEDY in member.output, member.output
                assert "Traceback" not in member.output


def test_serving_host_killed_with_no_member_holding_the_model_ends_every_client_clearly(tmp_path: Path) -> None:
    """The serving host killed mid-reply, no member holding the model (`--no-copy`: none given a copy either): the
    client's reply ends in one error.

    Its one timing check: the error reaches the client within LOSS_NOTICED_WITHIN_S of the kill (the link
    idle timeout and the margin a loaded machine needs, tests/session/cluster.py): the loss was noticed by
    the idle timeout, not by something slower. The kill waits on the reply's first text.
    """
    with Cluster(tmp_path, [(n, ["--api-port", "0"]) for n in ("ada", "bo")], host_args=["--no-copy"],
                 serve_host=True) as cluster:
        plan = cluster.wait_phase({"admitted"})["plan"]
        assert HOST_MEMBER in plan["order"]
        urls = {n: cluster.member_url(n) for n in ("ada", "bo")}
        streaming = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(cluster.stream_chat, STORY, 400, 120, streaming, urls["ada"])
            while not streaming.wait(0.1):
                if pending.done():
                    raise AssertionError(f"the reply ended before the kill: {pending.result()}")
            cluster.host.popen.kill()  # kill -9: the host and its machine's stage
            killed_at = time.monotonic()
            chunks = pending.result(timeout=120)
        errors = [(t, c["error"]["message"]) for t, c in chunks if isinstance(c, dict) and "error" in c]
        assert len(errors) == 1, chunks[-3:]
        errored_at, message = errors[0]
        assert errored_at - killed_at < LOSS_NOTICED_WITHIN_S, (errored_at - killed_at, message)
        assert f"{HOST_MEMBER} lost" in message and "left the session" in message and REMEDY in message, message
        for name in ("ada", "bo"):  # nothing hangs: every member ends, saying why
            member = cluster.members[name]
            assert member.popen.wait(60) == 1, member.output
            member.reader.join(5)
            assert REMEDY in member.output and "Traceback" not in member.output, member.output


@pytest.fixture(scope="module")
def story(smollm: Path) -> str:
    """Ground truth for a reply cut by the host's loss: llama-cpp-python's own greedy reply, up to the cut."""
    return llama_cpp_reply(smollm, STORY, STORY_TOKENS)


STORY_TOKENS = 48  # few: the machine running the tests may be slow, and the ring stops at the kill
HEIR = "bo"  # started with --model: the one survivor that can cut stages, so the one that takes over


def test_serving_host_killed_a_member_with_the_model_takes_over_and_the_reply_resumes(
        tmp_path: Path, smollm: Path, capital: str, story: str) -> None:
    """The serving host killed mid-reply: the member holding the model takes over, and the reply resumes.

    Its one timing check: the notice of the loss reaches the client within LOSS_NOTICED_WITHIN_S of the
    kill (the link idle timeout and the margin a loaded machine needs, tests/session/cluster.py): the loss
    was noticed by the idle timeout, not by something slower. The kill waits on the reply's first text.
    """
    members = [("ada", ["--api-port", "0"]), (HEIR, ["--api-port", "0", "--model", str(smollm)])]
    with Cluster(tmp_path, members, serve_host=True) as cluster:
        plan = cluster.wait_phase({"admitted"})["plan"]
        # the loss here is the coordinator's and a stage's, not the head's: the host's machine must not be the head
        assert HOST_MEMBER in plan["order"] and plan["head"] != HOST_MEMBER, plan
        urls = {n: cluster.member_url(n) for n, _ in members}
        streaming = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(cluster.stream_chat, STORY, STORY_TOKENS, 300, streaming, urls["ada"])
            while not streaming.wait(0.1):  # the first piece of text, or the request's own failure
                if pending.done():
                    raise AssertionError(f"the reply ended before the kill: {pending.result()}")
            cluster.host.popen.kill()  # kill -9: the host, its coordination and its machine's stage
            killed_at = time.monotonic()
            chunks = pending.result(timeout=300)
        outputs = {n: m.output[-4000:] for n, m in cluster.members.items()}
        check_resumed_reply(chunks, killed_at, story, outputs)
        # every survivor names the new coordinator, serving on a ring re-planned over the survivors
        for name, url in urls.items():
            state = cluster.wait_state(url, lambda s: s["coordinator"] == HEIR and s["phase"] == "admitted", 120)
            assert sorted(state["plan"]["order"]) == ["ada", HEIR], (name, state["plan"])
            assert "the coordinator (host) left the session" in state["coordinator_left"], state
        assert "takes coordination over" in cluster.members["ada"].output, outputs
        for url in urls.values():  # through the head's API and along the ring
            again = cluster.chat(PROMPT, MAX_TOKENS, url=url)
            assert again["choices"][0]["message"]["content"] == capital, (again, outputs)
        for proc in cluster.members.values():
            assert proc.popen.poll() is None and "Traceback" not in proc.output, proc.output
        procs = list(cluster.procs)
    assert all(proc.popen.poll() is not None for proc in procs)  # nothing is left running (stop checks each status)


def test_serving_host_killed_the_member_it_gave_a_copy_takes_over_and_the_reply_resumes(
        tmp_path: Path, smollm: Path, story: str) -> None:
    """No member holds the model: the host gives the first ring member after its own a copy (issue 32 (7)), and
    once that member holds it, the host's loss mid-reply is survived as if it had joined with `--model`."""
    with Cluster(tmp_path, [(n, ["--api-port", "0"]) for n in ("ada", "bo")], serve_host=True) as cluster:
        plan = cluster.wait_phase({"admitted"})["plan"]
        others = [n for n in plan["order"] if n != HOST_MEMBER]
        heir = others[0]  # the one that takes over: the first survivor in ring order holding the model
        copied = cluster.wait_state(cluster.url, lambda s: s["copies"].get(heir) == 1.0, 120)
        assert list(copied["copies"]) == [heir], copied["copies"]  # one copy: a single loss leaves every block
        cluster.host.wait_for(re.compile(f"{heir} holds a copy of the model"), 30)
        copy = next((tmp_path / "cache" / "copies").glob("*.gguf"))
        assert copy.read_bytes() == smollm.read_bytes()  # the file itself, not a re-cut of it
        urls = {n: cluster.member_url(n) for n in others}
        streaming = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(cluster.stream_chat, STORY, STORY_TOKENS, 300, streaming, urls[others[-1]])
            while not streaming.wait(0.1):
                if pending.done():
                    raise AssertionError(f"the reply ended before the kill: {pending.result()}")
            cluster.host.popen.kill()  # kill -9: the host, its coordination, its stage and its model file
            killed_at = time.monotonic()
            chunks = pending.result(timeout=300)
        outputs = {n: m.output[-4000:] for n, m in cluster.members.items()}
        check_resumed_reply(chunks, killed_at, story, outputs)
        for url in urls.values():
            state = cluster.wait_state(url, lambda s: s["coordinator"] == heir and s["phase"] == "admitted", 120)
            assert sorted(state["plan"]["order"]) == sorted(others), state["plan"]
        for proc in cluster.members.values():
            assert proc.popen.poll() is None and "Traceback" not in proc.output, proc.output


def test_coordinate_only_host_killed_then_a_member_a_holder_takes_over_and_re_plans(
        tmp_path: Path, smollm: Path, capital: str, story: str) -> None:
    members = [("ada", ["--api-port", "0"]), (HEIR, ["--api-port", "0", "--model", str(smollm)]),
               ("cy", ["--api-port", "0"])]
    with Cluster(tmp_path, members) as cluster:
        plan = cluster.wait_phase({"admitted"})["plan"]
        urls = {n: cluster.member_url(n) for n, _ in members}
        cluster.host.popen.kill()  # kill -9: the host held no stage, so the ring is whole
        cluster.host.popen.wait()
        reply = cluster.chat(PROMPT, MAX_TOKENS, url=urls[plan["head"]])  # serving never waits on the host
        assert reply["choices"][0]["message"]["content"] == capital, reply
        # every member names the one holding the model, which coordinates the ring as it is (no re-plan)
        for name, url in urls.items():
            state = cluster.wait_state(url, lambda s: s["coordinator"] == HEIR and s["coordinator_left"] is not None,
                                       120)
            assert state["phase"] == "admitted" and state["plan"]["order"] == plan["order"], (name, state)
        heir = cluster.members[HEIR]
        heir.wait_for(re.compile("took the serving ring over"), 120)
        # a later loss: a member holding no model, and not the head
        victim = next(n for n in plan["order"] if n not in (HEIR, plan["head"]))
        left = [n for n in plan["order"] if n != victim]
        streaming = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(cluster.stream_chat, STORY, STORY_TOKENS, 600, streaming, urls[HEIR])
            while not streaming.wait(0.1):
                if pending.done():
                    raise AssertionError(f"the reply ended before the kill: {pending.result()}")
            cluster.members[victim].popen.kill()
            chunks = pending.result(timeout=600)
        outputs = {n: m.output[-4000:] for n, m in cluster.members.items()}
        assert cluster.members[victim].popen.wait(10) == -9
        # the reply in flight resumes on the re-planned ring: exact up to the cut, then it goes on
        errors = [c["error"] for _, c in chunks[:-1] if "error" in c]
        assert chunks[-1][1] == "[DONE]" and not errors, "\n".join([f"errors: {errors}", *(
            f"--- {n}:\n{out[-2500:]}" for n, out in outputs.items())])
        notices = [(t, c["kafila"]["notice"]) for t, c in chunks[:-1] if "notice" in c.get("kafila", {})]
        assert len(notices) == 1 and f"{victim} was lost" in notices[0][1], (notices, outputs)
        pieces = [(t, ch["delta"].get("content", "")) for t, c in chunks[:-1] for ch in c.get("choices", [])]
        before = "".join(p for t, p in pieces if t < notices[0][0])
        assert before and story.startswith(before), (before, story)
        try:
            for name in left:  # re-planned over the two survivors, still coordinated by the holder
                state = cluster.wait_state(urls[name], lambda s: s["phase"] == "admitted"
                                           and sorted(s["plan"]["order"]) == sorted(left), 300)
                assert state["coordinator"] == HEIR, (name, state["coordinator"])
                again = cluster.chat(PROMPT, MAX_TOKENS, url=urls[name])
                assert again["choices"][0]["message"]["content"] == capital, (name, again)
        except (AssertionError, OSError) as exc:  # a survivor gone: its own words say why
            for name in left:
                exc.add_note(f"{name} (status {cluster.members[name].popen.poll()}):\n"
                             f"{cluster.members[name].output[-6000:]}")
            raise
        for name in left:
            proc = cluster.members[name]
            assert proc.popen.poll() is None and "Traceback" not in proc.output, proc.output
        procs = list(cluster.procs)
    assert all(proc.popen.poll() is not None for proc in procs)  # nothing is left running


def test_a_restarted_serving_host_rejoins_as_a_member_at_the_next_re_plan(
        tmp_path: Path, smollm: Path, capital: str) -> None:
    members = [("ada", ["--api-port", "0"]), (HEIR, ["--api-port", "0", "--model", str(smollm)])]
    with Cluster(tmp_path, members, serve_host=True) as cluster:
        cluster.wait_phase({"admitted"})
        url = cluster.member_url(HEIR)
        cluster.host.popen.kill()  # kill -9: the host and its machine's stage; the holder re-plans
        cluster.host.popen.wait()
        cluster.wait_state(url, lambda s: s["phase"] == "admitted" and sorted(s["plan"]["order"]) == ["ada", HEIR],
                           300)
        # the host's machine back, as a member under its old name: taken in, not refused
        back = Proc(HOST_MEMBER, ["join", cluster.code, "--rendezvous", cluster.rdv, "--name", HOST_MEMBER,
                                  "--api-port", "-1"], cluster.env)
        cluster.procs.append(back)
        heir = cluster.members[HEIR]
        heir.wait_for(re.compile(f"{HOST_MEMBER} rejoined the session"), 240)
        # held, or planned in at once where the probes say that cuts the slowest stage by GAIN (on one noisy
        # machine either can happen): both end with the ring serving again and the host's machine still there
        held = re.compile(f"{HOST_MEMBER} waits: a plan with it would not cut")
        cluster.wait_state(url, lambda s: s["phase"] == "admitted" and (
            HOST_MEMBER in s["plan"]["order"] or any(held.search(line) for line in list(heir.lines))), 300)
        assert back.popen.poll() is None, back.output
        cluster.members["ada"].popen.kill()  # the next loss: the ring is planned again, with the host's machine
        state = cluster.wait_state(url, lambda s: s["phase"] == "admitted"
                                   and sorted(s["plan"]["order"]) == [HEIR, HOST_MEMBER], 300)
        assert state["coordinator"] == HEIR, state
        again = cluster.chat(PROMPT, MAX_TOKENS, url=url)
        assert again["choices"][0]["message"]["content"] == capital, (again, back.output[-3000:])
        assert back.popen.poll() is None and "Traceback" not in back.output, back.output
        procs = list(cluster.procs)
    assert all(proc.popen.poll() is not None for proc in procs)  # nothing is left running

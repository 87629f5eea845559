"""The rendezvous killed (kill -9) in the emulated NAT lab, where ring edges go through its relay: every
relayed link ends with an error naming the lost relay, the host plans again over the member it still
reaches directly and serves llama.cpp's greedy reply; the members it cannot reach end, saying why.

Skipped without root or `nft` on a developer machine; a failure in CI (CI set), where it must run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kafila.lab.natlab import RDV_ALT_IP, RDV_IP, RDV_PORT, NatLab
from tests.conftest import llama_cpp_reply
from tests.session.cluster import CODE_RE, REPO, Proc, lab_env
from tests.shared_probe import shared_probe

PROMPT = "What is the capital of France?"
API_PORT = 8711  # inside the host's own namespace
# `lab` (tests/session/conftest.py): hosts 1 and 2 behind ordinary NATs, 3 and 4 behind restrictive ones
pytestmark = [pytest.mark.slow,
              pytest.mark.timeout(1200)]  # stage delivery over the relay is slow on a loaded 2-core machine
RELAY = f"the rendezvous at {RDV_IP}:{RDV_PORT}, is lost"  # how a link through the lost relay ends


def chat(lab: NatLab, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        lab.command(lab.host(1), [sys.executable, str(REPO / "kafila.py"), "chat", "--api",
                                  f"http://127.0.0.1:{API_PORT}", "--max-tokens", "12", "--temperature", "0"]),
        input=PROMPT + "\n", capture_output=True, text=True, timeout=180, env=env, cwd=REPO,
    )


def test_rendezvous_killed_relayed_edges_fail_naming_it_and_the_host_plans_again(
        lab: NatLab, tmp_path: Path, smollm: Path) -> None:
    env = lab_env(tmp_path)
    # one probe for the members, the tests' shared one (measured afresh here, it met the other tests' load)
    shared_probe(tmp_path / "cache")
    truth = llama_cpp_reply(smollm, PROMPT, 12)
    rdv = f"{RDV_IP}:{RDV_PORT}"
    procs = [Proc("rendezvous", ["rendezvous", "--host", RDV_IP, "--port", str(RDV_PORT), "--alt-ip", RDV_ALT_IP],
                  env, lab.command(lab.pub, []))]
    lab.track(procs[0].popen)

    def everything() -> str:
        return "\n".join(f"== {p.name} (status {p.popen.poll()})\n{p.output}" for p in procs)

    try:
        procs[0].wait_for(re.compile("listening"), 30)
        host = Proc("host", ["host", "--rendezvous", rdv, "--members", "3", "--coordinate-only", "--context", "512",
                             "--wait", "300", "--api-port", str(API_PORT)], env, lab.command(lab.host(1), []))
        procs.append(host)
        lab.track(host.popen)
        code = host.wait_for(CODE_RE, 60).group(1)
        members = {}
        for i, name in ((2, "ord"), (3, "res1"), (4, "res2")):
            members[name] = Proc(name, ["join", code, "--rendezvous", rdv, "--name", name, "--api-port", "-1"], env,
                                 lab.command(lab.host(i), []))
            procs.append(members[name])
            lab.track(members[name].popen)
        if not host.wait_for_either(re.compile("admitted: 3 members"), 300):
            raise AssertionError(everything())
        edges = re.findall(r"edge (\S+) → (\S+): predicted (\w+), (\w+)", host.output)
        assert any(actual == "relayed" for *_, actual in edges), host.output
        first = chat(lab, env)
        assert first.returncode == 0 and first.stdout.split("kafila> ", 1)[1].split("\n", 1)[0] == truth, first

        procs[0].popen.kill()  # kill -9 the rendezvous, and with it the relay
        procs[0].popen.wait()
        # the restrictive members' links all went through the relay: each ends, naming it
        for name in ("res1", "res2"):
            status = members[name].popen.wait(120)
            members[name].reader.join(5)
            assert status == 1 and RELAY in members[name].output, everything()
        # the host loses them with that reason, and plans again over the member it reaches directly
        if not host.wait_for_either(re.compile("admitted: 1 members"), 180):
            raise AssertionError(everything())
        assert re.search(rf"member res\d was lost: .*{re.escape(RELAY)}", host.output), host.output
        again = chat(lab, env)
        assert again.returncode == 0, (again.stderr, everything())
        assert again.stdout.split("kafila> ", 1)[1].split("\n", 1)[0] == truth, again.stdout
        for p in procs:
            for text in ("Traceback", "internal error", "ExceptionGroup"):
                assert text not in p.output, everything()
        assert host.popen.poll() is None and members["ord"].popen.poll() is None
    finally:
        for p in procs:  # the rendezvous too, when the test ended before it was killed
            if p.popen.poll() is None:
                p.popen.terminate()
        for p in procs:
            try:
                p.popen.wait(30)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                raise AssertionError(f"{p.name} did not stop within 30 s of SIGTERM:\n{p.output}") from None

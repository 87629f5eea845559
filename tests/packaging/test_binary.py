"""The one-file binary alone does what the Python checkout does (issue 7).

Builds `kafila` with build.spec once per session (see conftest.py; KAFILA_SKIP_BINARY=1 skips),
then runs it with a clean environment from a folder outside the repository. The Python run of
the same command is the ground truth. `kafila demo` from the binary starts the rendezvous and the
members as the binary itself (kafila.session.launch.demo.kafila_argv), so a whole loopback ring made of
the binary alone must answer as the Python ring does, and leave no process or unpacked bundle behind.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafila.net.ports import free_udp_pair
from tests.conftest import processes_marked, run_kafila
from tests.packaging.conftest import BUILD_TIMEOUT_S, REPO, REPORT, Binary, clean_env
from tests.shared_probe import shared_probe_model

# The build happens in the first test's setup: allow for it on a busy two-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 600)]

STARTUP_RUNS = 5  # timed for the report only: how fast it starts belongs in benchmarks, not in a pass/fail
PORT_TRIES = 5


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The run's stdout, after checking it exited 0 (its output is in the message if not)."""
    assert proc.returncode == 0, (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")
    return proc.stdout


def test_version_matches_python(kafila_binary: Binary) -> None:
    timings = []
    for _ in range(STARTUP_RUNS):
        start = time.perf_counter()
        out = _ok(kafila_binary.run("--version"))
        timings.append(time.perf_counter() - start)
    median = statistics.median(timings)
    REPORT["--version start-up"] = (f"{median:.2f} s median of {STARTUP_RUNS} "
                                    f"(min {min(timings):.2f} s, max {max(timings):.2f} s)")
    # The llama.cpp build identity must be the one the Python install reports: members compare it,
    # and a binary that failed to find llama_cpp/lib would hash nothing.
    assert out == _ok(run_kafila("--version"))
    assert "llama.cpp libs" in out
    # Each start unpacks the bundle (about 250 MB) into $TMPDIR; a clean exit must remove it.
    assert not list((kafila_binary.root / "tmp").glob("_MEI*"))


def test_every_command_is_inside(kafila_binary: Binary) -> None:
    # kafila.cli imports command modules by name and leaves out any it cannot find, so a module
    # missing from the bundle would silently drop a command: the help must list the same ones.
    frozen = _ok(kafila_binary.run("--help"))
    assert frozen == _ok(run_kafila("--help", env={"COLUMNS": "80"}))


def test_plan_on_a_fleet_file(kafila_binary: Binary) -> None:
    for name in ("fleet-lan.json", "qwen3-8b-q4_k_m.json"):
        shutil.copy(REPO / "bench" / name, kafila_binary.root / name)
    out = _ok(kafila_binary.run("plan", "--fleet", "fleet-lan.json", "--model", "qwen3-8b-q4_k_m.json", "--json"))
    plan = json.loads(out)
    assert plan["feasible"] is True, plan
    python = _ok(run_kafila("plan", "--fleet", str(REPO / "bench" / "fleet-lan.json"), "--model",
                            str(REPO / "bench" / "qwen3-8b-q4_k_m.json"), "--json"))
    assert plan == json.loads(python)  # the same plan, number for number


def test_inspect_embedded_model(kafila_binary: Binary) -> None:
    out = _ok(kafila_binary.run("inspect", "--json"))
    assert json.loads(out) == json.loads(_ok(run_kafila("inspect", "--json")))


def test_generate_matches_python(kafila_binary: Binary) -> None:
    args = ("generate", "--split", "10,20", "--max-tokens", "24", "--temperature", "0", "The capital of France is")
    frozen = _ok(kafila_binary.run(*args))
    python = _ok(run_kafila(*args))
    REPORT["generate vs Python"] = "identical" if frozen == python else "DIFFERENT"
    assert frozen == python
    assert frozen.strip()


# --- every role from the binary ------------------------------------------------------------------

DEMO_ARGS = ("demo", "--prompt", "What is the capital of France?", "--max-tokens", "24", "--temperature", "0",
             "--json", "--api-port", "0")
DEMO_TIMEOUT_S = 600  # the demo waits up to 600 s for admission itself; normally about a minute here
STOP_GRACE_S = 30.0


def _run_gently(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """subprocess.run, except that a run past `timeout` is stopped with SIGINT, then SIGTERM.

    SIGKILL on a one-file binary kills only its bootloader (the Python process then gets SIGTERM
    from the kernel, but the unpacked folder stays), so it is the last resort here.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, encoding="utf-8", env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            proc.send_signal(sig)
            try:
                out, err = proc.communicate(timeout=STOP_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
        pytest.fail(f"{argv[1:3]} ran past {timeout:.0f} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _leftovers(*markers: str, settle_s: float = 10.0) -> dict[int, str]:
    """The marked processes still alive `settle_s` after the run ended; each is then sent SIGTERM."""
    deadline = time.monotonic() + settle_s
    while (left := processes_marked(*markers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # leave nothing running on the machine, whatever the test concludes
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return left


def _check_ring(result: dict, who: str) -> None:
    plan = result["plan"]
    assert result["admitted"] is True and plan["feasible"] is True, f"{who}: {result}"
    assert sorted(plan["order"]) == ["ada", "bo", "cy"] == sorted(plan["ranges"]), f"{who}: {plan}"
    assert sorted(result["members"]) == ["ada", "bo", "cy"], f"{who}: {result['members']}"
    # three stages that together hold every block once
    ranges = sorted(plan["ranges"].values())
    assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), f"{who}: {plan}"
    assert all(a[0] < a[1] for a in ranges), f"{who}: {plan}"


def test_demo_ring_matches_python(kafila_binary: Binary, tmp_path: Path) -> None:
    """A rendezvous, the host and three members, every one of them the binary, answer as the Python run does.

    The members and the rendezvous are `sys.executable join|rendezvous ...`: PyInstaller (6.22 here) runs
    such children of a one-file program as sub-processes of the same instance, in the parent's
    $TMPDIR/_MEIxxxxxx, so the bundle is unpacked once; the demo stops them before it exits.
    """
    frozen_dir, python_dir = tmp_path / "frozen", tmp_path / "python"
    for sub in ("home", "tmp", "cache"):
        (frozen_dir / sub).mkdir(parents=True)
    for run in (frozen_dir, python_dir):  # both probe this machine, neither writes the probe's 840 MB model
        shared_probe_model(run / "cache")
    env = {**clean_env(frozen_dir / "home", frozen_dir / "tmp"), "KAFILA_CACHE_DIR": str(frozen_dir / "cache")}
    start = time.perf_counter()
    frozen = _run_gently([str(kafila_binary.path), *DEMO_ARGS], env=env, cwd=frozen_dir, timeout=DEMO_TIMEOUT_S)
    frozen_s = time.perf_counter() - start
    left = _leftovers(str(frozen_dir), str(kafila_binary.path))
    unpacked = list((frozen_dir / "tmp").glob("_MEI*"))
    logs = frozen_dir / "cache" / "demo-logs"
    if frozen.returncode != 0:  # a module or data file missing from the bundle shows in a member's log
        tails = "".join(f"\n--- {f.name}:\n{f.read_text(errors='replace')[-1500:]}" for f in sorted(logs.glob("*.log")))
        pytest.fail(f"the binary's demo exited {frozen.returncode}\nstderr:\n{frozen.stderr[-3000:]}{tails}")
    frozen_result = json.loads(frozen.stdout)  # stdout is the one JSON object and nothing else

    python_env = {**os.environ, "KAFILA_CACHE_DIR": str(python_dir / "cache")}
    start = time.perf_counter()
    python = _run_gently([sys.executable, str(REPO / "kafila.py"), *DEMO_ARGS], env=python_env, cwd=REPO,
                         timeout=DEMO_TIMEOUT_S)
    python_s = time.perf_counter() - start
    python_left = _leftovers(str(python_dir))

    python_result = json.loads(_ok(python))
    same = frozen_result["text"] == python_result["text"]
    REPORT["demo ring from the binary"] = (f"{frozen_s:.0f} s (the Python run {python_s:.0f} s), "
                                           f"text {'identical' if same else 'DIFFERENT'}")
    _check_ring(python_result, "python")
    _check_ring(frozen_result, "binary")
    assert frozen_result["text"].strip()
    assert frozen_result["text"] == python_result["text"]
    for name in ("ada", "bo", "cy"):
        assert "admitted: serving" in (logs / f"{name}.log").read_text(), (logs / f"{name}.log").read_text()
    assert "rendezvous listening" in (logs / "rendezvous.log").read_text()
    assert not left, f"the binary's processes outlived the demo: {left}"
    assert not python_left, f"the Python demo's processes outlived it: {python_left}"
    assert not unpacked, f"the binary left its unpacked bundle behind: {unpacked}"


def _start_rendezvous(binary: Binary, log: Path, env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The binary's rendezvous on a free port pair, once it listens; (process, port).

    A port found free here can be taken by another process before the rendezvous binds it: then it
    exits with an error, and it starts again on another.
    """
    for _ in range(PORT_TRIES):
        port = free_udp_pair()
        with log.open("wb") as out:
            rdv = subprocess.Popen([str(binary.path), "rendezvous", "--host", "127.0.0.1", "--port", str(port)],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=cwd)
        deadline = time.monotonic() + 60
        while b"listening" not in log.read_bytes() and rdv.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        if b"listening" in log.read_bytes():
            return rdv, port
        rdv.wait()
    pytest.fail(f"the rendezvous never listened in {PORT_TRIES} tries:\n{log.read_text()}")


@pytest.mark.parametrize("command", ["rendezvous", "join", "tui"])
def test_role_help_matches_python(kafila_binary: Binary, command: str) -> None:
    frozen = _ok(kafila_binary.run(command, "--help"))
    assert frozen == _ok(run_kafila(command, "--help", env={"COLUMNS": "80"}))


def test_rendezvous_and_join_run_directly(kafila_binary: Binary, tmp_path: Path) -> None:
    """`kafila rendezvous` from the binary serves `kafila join` from the binary, and stops on SIGTERM."""
    for sub in ("home", "tmp", "cache"):
        (tmp_path / sub).mkdir()
    shared_probe_model(tmp_path / "cache")
    env = {**clean_env(tmp_path / "home", tmp_path / "tmp"), "KAFILA_CACHE_DIR": str(tmp_path / "cache")}
    log = tmp_path / "rendezvous.log"
    rdv, port = _start_rendezvous(kafila_binary, log, env, tmp_path)
    try:
        # An unknown session: the member measures this machine, reaches the rendezvous over QUIC and
        # is told there is no such session. Everything a real join does up to the host.
        joined = _run_gently([str(kafila_binary.path), "join", "zzzzzzzz-aaaa-aaaa-aaaa-aaaa",
                              "--rendezvous", f"127.0.0.1:{port}", "--name", "ada", "--api-port", "-1"],
                             env=env, cwd=tmp_path, timeout=180)
        assert joined.returncode == 1, joined
        assert "expired, or the join code is mistyped" in joined.stderr and "Traceback" not in joined.stderr, joined
    finally:
        rdv.send_signal(signal.SIGTERM)  # to the bootloader, which passes it on to the Python process
        try:
            rdv.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            rdv.send_signal(signal.SIGINT)
            rdv.wait(STOP_GRACE_S)
    assert "rendezvous stopped" in log.read_text(), log.read_text()
    assert not _leftovers(str(tmp_path))
    assert not list((tmp_path / "tmp").glob("_MEI*"))


def test_killing_the_bootloader_leaves_no_process_behind(kafila_binary: Binary, tmp_path: Path) -> None:
    """SIGKILL reaches only the one-file binary's bootloader; its Python process must not live on."""
    for sub in ("home", "tmp"):
        (tmp_path / sub).mkdir()
    log = tmp_path / "rendezvous.log"
    rdv, _ = _start_rendezvous(kafila_binary, log, clean_env(tmp_path / "home", tmp_path / "tmp"), tmp_path)
    assert len(processes_marked(str(tmp_path))) == 2  # the bootloader and its Python process
    rdv.kill()
    rdv.wait(10)
    assert not _leftovers(str(tmp_path)), log.read_text()
    assert "rendezvous stopped" in log.read_text()  # it was told, and stopped as on SIGTERM


"""`kafila tui` options: what each flow is given, and the errors a person sees."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from kafila.cli import build_parser
from kafila.errors import SessionError
from kafila.session.options import HostOptions, MemberOptions
from kafila.tui.flows import flow_for
from tests.conftest import REPO

pytestmark = pytest.mark.fast


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["tui", *argv])


def test_host_options() -> None:
    flow, mode = flow_for(parse("--host", "model.gguf", "--rendezvous", "127.0.0.1:4000", "--members", "2",
                                "--concurrency", "3", "--api-port", "0"))
    assert mode == "host"
    opts = flow.args[0]  # type: ignore[attr-defined]
    assert isinstance(opts, HostOptions)
    assert opts.model == Path("model.gguf") and opts.rendezvous == ("127.0.0.1", 4000)
    assert (opts.members, opts.settings.concurrency, opts.api_port) == (2, 3, 0)
    assert opts.settings.context == HostOptions().settings.context  # not given: the runner's default


def test_host_without_model_means_the_embedded_one() -> None:
    flow, _ = flow_for(parse("--host"))
    assert flow.args[0].model is None  # type: ignore[attr-defined]


def test_host_name_names_the_hosts_ring_member() -> None:
    """`--name` names the host's own member, as `kafila host --name` does (it was once ignored with --host)."""
    flow, _ = flow_for(parse("--host", "--name", "hosty"))
    assert flow.args[0].name == "hosty"  # type: ignore[attr-defined]
    flow, _ = flow_for(parse("--host"))
    assert flow.args[0].name == HostOptions().name  # not given: the machine's host name


def test_join_options() -> None:
    flow, mode = flow_for(parse("--join", "abcd-efgh", "--name", "lab-pc", "--rendezvous", "127.0.0.1:3999"))
    opts = flow.args[0]  # type: ignore[attr-defined]
    assert mode == "member" and isinstance(opts, MemberOptions)
    assert (opts.code, opts.name, opts.rendezvous) == ("abcd-efgh", "lab-pc", ("127.0.0.1", 3999))


def test_demo_options() -> None:
    from kafila.session.launch.demo import DemoOptions, run_demo

    flow, mode = flow_for(parse("--demo", "--context", "1024"))
    assert mode == "demo" and flow.func is run_demo  # type: ignore[attr-defined]
    opts = flow.args[0]  # type: ignore[attr-defined]
    assert isinstance(opts, DemoOptions) and opts.context == 1024


def test_bad_rendezvous_is_a_session_error() -> None:
    with pytest.raises(SessionError, match="rendezvous address"):
        flow_for(parse("--join", "x", "--rendezvous", "nowhere.invalid:notaport"))


def test_only_one_of_the_modes() -> None:
    with pytest.raises(SystemExit):
        parse("--demo", "--join", "x")


@pytest.mark.parametrize("content, message", [(None, "cannot read the recorded state"),
                                              ("{not json", "is not a recorded Kafila session state"),
                                              ('{"members": {"a": {"nope": 1}}}', "is not a recorded")])
def test_replay_errors(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "state.json"
    if content is not None:
        path.write_text(content)
    r = subprocess.run([sys.executable, str(REPO / "kafila.py"), "tui", "--replay", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("kafila: error: ") and message in r.stderr and "Traceback" not in r.stderr

"""`kafila host --wait`: when it expires with fewer members than asked, the host plans over those that came;
with none, it ends with a one-line reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import llama_cpp_reply
from tests.session.cluster import Cluster

pytestmark = pytest.mark.slow


def test_wait_expiring_plans_over_the_members_that_came(tmp_path: Path, smollm: Path) -> None:
    expected = llama_cpp_reply(smollm, "Name three colours.", 4)
    with Cluster(tmp_path, [("ada", [])], host_args=["--members", "3", "--wait", "20"]) as cluster:
        state = cluster.wait_phase({"admitted", "rejected"})
        assert state["phase"] == "admitted", cluster.host.output
        assert state["plan"]["order"] == ["ada"] and state["plan"]["ranges"]["ada"] == [0, 30]
        assert "ada joined (1/3)" in cluster.host.output and "planning over ada" in cluster.host.output
        reply = cluster.chat("Name three colours.", 4)
        assert reply["choices"][0]["message"]["content"] == expected, reply


def test_wait_expiring_with_no_member_ends_the_session(tmp_path: Path) -> None:
    with Cluster(tmp_path, [], host_args=["--members", "2", "--wait", "5"]) as cluster:
        assert cluster.host.popen.wait(120) == 1
        cluster.host.reader.join(5)
        assert "kafila: error: no member joined within 5 s" in cluster.host.output
        assert "Traceback" not in cluster.host.output

"""`kafila host --wait`: when it expires with fewer members than asked, the host plans over those that came;
with none, it ends with a one-line reason.

Neither test times the expiry; each checks what the host does at it. With a member, the wait must outlast
that member's start and join, which a loaded machine stretches (a fixed 20 s was missed): it is
WAIT_S, the join timeout a member itself is given to reach its host (kafila.session.options).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kafila.session.options import MemberOptions
from tests.conftest import llama_cpp_reply
from tests.session.cluster import Cluster

pytestmark = pytest.mark.slow

WAIT_S = MemberOptions.join_timeout_s


def test_wait_expiring_plans_over_the_members_that_came(tmp_path: Path, smollm: Path) -> None:
    expected = llama_cpp_reply(smollm, "Name three colours.", 4)
    with Cluster(tmp_path, [("ada", [])], host_args=["--members", "3", "--wait", f"{WAIT_S:g}"]) as cluster:
        state = cluster.wait_phase({"admitted", "rejected"}, WAIT_S + 240)
        assert state["phase"] == "admitted", cluster.host.output
        assert state["plan"]["order"] == ["ada"] and state["plan"]["ranges"]["ada"] == [0, 30]
        out = cluster.host.output
        assert "ada joined (1/3)" in out and "planning over ada" in out, out
        assert out.index("ada joined (1/3)") < out.index("planning over ada"), out  # ada came before the expiry
        reply = cluster.chat("Name three colours.", 4)
        assert reply["choices"][0]["message"]["content"] == expected, reply


def test_wait_expiring_with_no_member_ends_the_session(tmp_path: Path) -> None:
    with Cluster(tmp_path, [], host_args=["--members", "2", "--wait", "5"]) as cluster:
        assert cluster.host.popen.wait(120) == 1
        cluster.host.reader.join(5)
        assert "kafila: error: no member joined within 5 s" in cluster.host.output
        assert "Traceback" not in cluster.host.output

"""A member told to stop (SIGTERM) while llama.cpp loads its stage stops the load and exits cleanly.

Loading a big stage takes seconds (llama.cpp repacks Q4_0 for the CPU; on a GPU it copies every
tensor), and it ran on a worker thread that nothing could stop: asyncio.run's exit waited for the
whole load (for a large model, past the CLI's 15 s deadline: "stopping took over", status 1).

The moment is made certain without timing it, as test_host_stop.py does: the member runs with
llama.cpp's log (-vv); once llama.cpp says it is loading tensors the member is stopped (SIGSTOP),
told to stop (SIGTERM) and let go on (SIGCONT). llama.cpp logs "constructing llama_context" only
after the model has loaded, so a load that ran on after the SIGTERM shows in the output.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from kafila.model.random_gguf import SHAPES, write_random_gguf
from tests.session.cluster import STOPPED_STATUSES, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
BLOCKS = 4  # Llama-3-8B-shaped Q4_0 blocks, 123 MB each: a load of seconds, the cut not much longer
LOADING_RE = re.compile(r"load_tensors: loading model tensors")
LOADED = "constructing llama_context"  # llama.cpp's log once the model is loaded, as it makes the context
# kafila.py with -vv before the command (the cluster helper passes only the command's own arguments)
VERBOSE = "import sys; from kafila.cli import main; sys.exit(main(['-vv', *sys.argv[1:]]))"


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("slow") / "slow.gguf"
    return write_random_gguf(path, SHAPES["llama3-8b"], BLOCKS, tokenizer=False)


def test_sigterm_while_loading_a_stage_stops_the_load_and_the_member(tmp_path: Path, slow_model: Path) -> None:
    # the member holds the model and cuts its stage itself: sending it over QUIC would take minutes here
    with Cluster(tmp_path, [("ada", ["--model", str(slow_model)])], host_args=[str(slow_model)],
                 scripts={"ada": VERBOSE}) as cluster:
        member = cluster.members["ada"]
        member.wait_for(LOADING_RE, 400)
        member.stop_now()
        try:
            loaded = LOADED in member.settled_output()
            assert not loaded, "the load ended before the member was stopped: the test proved nothing"
            member.popen.send_signal(signal.SIGTERM)
        finally:
            os.kill(member.popen.pid, signal.SIGCONT)
        status = member.popen.wait(120)  # a bound on a hang only: the CLI itself gives up after 15 s
        member.reader.join(5)
        out = member.output
        assert status in STOPPED_STATUSES and "stopping took over" not in out, out[-5000:]
        assert "Traceback" not in out, out[-5000:]
        assert LOADED not in out, "the member's stage load ran on to its end after SIGTERM"
        # its only member gone, the host ends the session by itself (status 1), before the cluster stops it
        assert cluster.host.popen.wait(120) == 1, cluster.host.output

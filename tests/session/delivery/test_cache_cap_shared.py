"""The cache's size cap, applied when a session starts, on a cache that sessions running beside it use.

The demo's members share one cache (`KAFILA_CACHE_DIR`), and a host's own member shares its host's process
and cache; each session's start applies the cap (cache_inventory.start_cache_use), removing the least
recently used files no running session lists. Here the cap is one byte, so that it removes every file it
may: whatever a running session uses must survive it, and an old file nobody uses must not (the cap ran).

- a member's stage that is still arriving (its `.part`, then the verified file) survives another session's
  start: a real member (MemberRuntime) receives a real stage over a real link (tests/session/scripted.py);
- two sessions in one process (`kafila host`: its coordinator's cut stages and its own member's stage) each
  keep theirs, also once the other has ended;
- a member's stage listed by another process (a demo member) survives this one's start.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafila.session.delivery.cache_inventory import start_cache_use
from kafila.session.delivery.transfer import send_stage
from kafila.session.protocol import messages
from kafila.session.state import SessionState
from tests.session.scripted import WAIT_S, assign, host_stage, member

pytestmark = pytest.mark.fast

DAY = 24 * 3600


@pytest.fixture
def one_byte_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text("cache_max_gb = 1e-9\n")
    monkeypatch.setenv("KAFILA_CONFIG", str(config))


def old_file(root: Path, rel: str) -> Path:
    """A file of the cache that no running session uses, two days old."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * 1000)
    t = time.time() - 2 * DAY
    os.utime(path, (t, t))
    return path


async def until(state: SessionState, done: object) -> None:
    """Until `done(state)` holds, woken by each change of the state."""
    changed = asyncio.Event()
    state.subscribe(lambda s: changed.set())
    async with asyncio.timeout(WAIT_S):
        while not done(state):  # type: ignore[operator]
            changed.clear()
            await changed.wait()


@pytest.mark.usefixtures("one_byte_cap")
async def test_a_session_starting_while_a_member_receives_its_stage_leaves_the_transfer_be(tmp_path: Path) -> None:
    shared = tmp_path / "cache"
    unused = old_file(shared, "delivered/" + "d" * 64 + ".gguf")
    source, manifest = host_stage(tmp_path)
    n = len(manifest.chunks)
    with start_cache_use(shared) as use:  # ada's start, as `kafila join` makes it
        async with member(tmp_path, "ada", others=[], use=use, cache_dir=shared) as m:
            await m.host.send(assign(1, manifest))
            need = await m.first(messages.Need)
            await send_stage(m.host.inbox.link, source, manifest, list(need.chunks[:n // 2]))
            half = n // 2 * manifest.chunk_size
            await until(m.runtime.state, lambda s: s.delivery["ada"][0] >= half)  # stored in its `.part`
            part = shared / "delivered" / f"{manifest.sha256}.part"
            assert part.is_file()
            start_cache_use(shared)  # another member's session starts on the same cache
            assert not unused.exists(), "the cap did not run"
            assert part.is_file(), "another session's start removed the stage ada is receiving"
            await send_stage(m.host.inbox.link, source, manifest, list(need.chunks[n // 2:]))
            assert await m.first(messages.Loaded) == messages.Loaded(1)
            held = shared / "delivered" / f"{manifest.sha256}.gguf"
            assert held.read_bytes() == source.read_bytes()
            start_cache_use(shared)  # and one more while ada serves it
            assert held.read_bytes() == source.read_bytes()


@pytest.mark.usefixtures("one_byte_cap")
def test_two_sessions_in_one_process_each_keep_their_files_from_a_third_sessions_start(tmp_path: Path) -> None:
    """`kafila host`: the coordinator (coordinator.session) and its own member (member.join) each start a
    session in one process, on one cache; a third session on that cache (a demo member, say) starts."""
    root = tmp_path / "cache"
    with start_cache_use(root) as host:
        cut = old_file(root, "stages/abc/body-0-10.gguf")  # the coordinator's cut stage, delivered to members
        host.add(cut)
        with start_cache_use(root) as own:
            delivered = old_file(root, "delivered/" + "e" * 64 + ".gguf")  # the host's own member serves it
            own.add(delivered)
            unused = old_file(root, "delivered/" + "f" * 64 + ".gguf")
            start_cache_use(root)
            assert not unused.exists(), "the cap did not run"
            assert cut.is_file() and delivered.is_file(), "a session's start removed what one beside it uses"
        start_cache_use(root)  # the host's own member left the ring (its end is not the session's)
        assert cut.is_file(), "the coordinator's stage went when the member beside it ended"
        assert not delivered.exists()  # no longer in use: the cap may take it
    start_cache_use(root)
    assert not cut.exists()


MEMBER_PROCESS = """
import sys
from pathlib import Path
from kafila.session.delivery.cache_inventory import InUse
with InUse(Path(sys.argv[1])) as use:
    use.add(Path(sys.argv[2]))
    print("serving", flush=True)
    sys.stdin.read()  # until the test says the session is over
"""


@pytest.mark.usefixtures("one_byte_cap")
def test_a_stage_another_member_process_serves_survives_this_ones_start(tmp_path: Path) -> None:
    """The demo: each member is its own `kafila join` process on the shared cache."""
    root = tmp_path / "cache"
    served = old_file(root, "delivered/" + "a" * 64 + ".gguf")
    unused = old_file(root, "delivered/" + "b" * 64 + ".gguf")
    ada = subprocess.Popen([sys.executable, "-c", MEMBER_PROCESS, str(root), str(served)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    try:
        assert ada.stdout is not None and ada.stdout.readline() == "serving\n"
        with start_cache_use(root):  # bo's start
            assert not unused.exists(), "the cap did not run"
            assert served.is_file(), "bo's start removed the stage ada serves"
    finally:
        ada.communicate("", timeout=60)
    assert ada.returncode == 0
    start_cache_use(root)  # ada's session is over: its stage is no longer needed
    assert not served.exists()

"""The host's side of a model copy: a member's asks make the host send each chunk at most once an offer."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, cast

import pytest

from kafila.net.quic import Link
from kafila.net.trust import VerifiedMember
from kafila.planner.reachability import NatClass
from kafila.session.delivery.model_copy_sender import ModelCopies
from kafila.session.protocol import messages
from kafila.session.protocol.chunks import COPY_MAGIC, parse_chunk
from kafila.session.protocol.manifest import CHUNK_SIZE
from kafila.session.settings import SessionSettings
from kafila.session.state import SessionState

pytestmark = pytest.mark.fast

HOST, HEIR = "host", "heir"


class CountingLink:
    """The host's end of a link to the heir, in memory: every chunk written to it is parsed and counted."""

    def __init__(self) -> None:
        self.sent: Counter[int] = Counter()  # chunk index -> times written
        self.bytes = 0  # the model's bytes written, every copy of every chunk

    async def send(self, data: bytes) -> None:
        index, payload = parse_chunk(data, COPY_MAGIC)
        self.sent[index] += 1
        self.bytes += len(payload)
        await asyncio.sleep(0)  # a real send yields to the loop


class Host:
    """A ModelCopies as the host runtime holds it, with the heir its one other ring member."""

    def __init__(self, model: Path) -> None:
        self.told: list[messages.Control] = []
        self.link = CountingLink()
        peer = VerifiedMember(b"\x01" * 8, HEIR, b"\0" * 32, NatClass.PERMISSIVE, None, None, None, None, {})
        self.peers = {HEIR: peer}
        self.copies = ModelCopies(SessionState(role="host", me=HOST), SessionSettings(), model, HOST, self._tell,
                                  self._spawn)
        self.tasks: set[asyncio.Task[None]] = set()

    async def _tell(self, who: str, msg: messages.Control) -> bool:
        assert who == HEIR
        self.told.append(msg)
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        return task

    async def settle(self) -> None:
        """Until every task the copies started is done (the offer, the batches it sends)."""
        while pending := [t for t in self.tasks if not t.done()]:
            await asyncio.wait(pending)

    async def offer(self) -> None:
        before = len(self.told)
        self.copies.offer([HOST, HEIR], self.peers)
        await self.settle()
        assert len(self.told) == before + 1 and isinstance(self.told[-1], messages.Copy)

    async def ask(self, *chunks: int) -> None:
        """The heir's `copy_need`, as the runtime passes it on; then until what it asked for is written."""
        self.copies.need(HEIR, cast(Link, self.link), messages.CopyNeed(chunks))
        await self.settle()


def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * (CHUNK_SIZE // 256) * 3 + b"tail")  # 3 chunks and a bit: 4 chunks
    return path


def test_two_hundred_asks_for_chunk_0_send_it_once(tmp_path: Path) -> None:
    """The finding's experiment: 200 `copy_need`, each asking for chunk 0 eight times (and past the end), made the
    host send 200 × 8 MiB; the host now sends chunk 0 once, no more than one copy's bytes in all."""
    model = model_file(tmp_path)

    async def main() -> None:
        host = Host(model)
        await host.offer()
        for _ in range(200):
            await host.ask(*[0] * 8)
        await host.ask(1 << 20, 4, 99)  # indices past the model's 4 chunks: nothing to send
        assert host.link.sent == Counter({0: 1})
        assert host.link.bytes == CHUNK_SIZE <= model.stat().st_size

    asyncio.run(main())


def test_a_new_offer_sends_again_what_the_heir_still_lacks(tmp_path: Path) -> None:
    """Each offer (one an admission) lets the heir ask once more for each chunk, so a copy cut short resumes; what
    one offer's asks can make the host send stays within the model's size."""
    model = model_file(tmp_path)

    async def main() -> None:
        host = Host(model)
        await host.offer()
        for _ in range(3):
            await host.ask(0, 1, 2, 3, 3, 2, 1, 0)
        assert host.link.sent == Counter({0: 1, 1: 1, 2: 1, 3: 1})
        assert host.link.bytes == model.stat().st_size
        await host.offer()  # the next admission's
        for _ in range(3):
            await host.ask(2, 3)
        assert host.link.sent == Counter({0: 1, 1: 1, 2: 2, 3: 2})

    asyncio.run(main())


def test_only_the_heir_is_sent_chunks(tmp_path: Path) -> None:
    model = model_file(tmp_path)

    async def main() -> None:
        host = Host(model)
        await host.offer()
        host.copies.need("mallory", cast(Link, host.link), messages.CopyNeed((0, 1)))
        await host.settle()
        assert host.link.bytes == 0

    asyncio.run(main())

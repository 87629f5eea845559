"""Fixtures of the ring's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kafila.model.stage_cache import StageCache
from kafila.session.ring.head import Head
from tests.session.solo_head import N_CTX, solo_head


@pytest.fixture
async def head(smollm: Path, stage_cache: StageCache) -> AsyncIterator[Head]:
    """A ring of one: the whole SmolLM2 as a running head's stage, in this process, N_CTX a request."""
    async with solo_head(smollm, stage_cache, N_CTX) as h:
        yield h

"""File chunks on a link: a stage's and a model copy's, told apart by their magic."""

from __future__ import annotations

import pytest

from kafila.errors import ProtocolError
from kafila.session.protocol import chunks
from kafila.session.protocol import messages as m

pytestmark = pytest.mark.fast


def test_a_model_copys_chunks_are_told_from_a_stages() -> None:
    # a copy chunk arriving while a stage is received must not be taken for one of the stage's chunks
    raw = chunks.chunk(3, b"data", chunks.COPY_MAGIC)
    assert m.kind(raw) == "copy" and m.kind(chunks.chunk(3, b"data")) == "chunk"
    assert chunks.parse_chunk(raw, chunks.COPY_MAGIC) == (3, b"data")
    with pytest.raises(ProtocolError, match="not a stage chunk"):
        chunks.parse_chunk(raw)
    with pytest.raises(ProtocolError, match="not a model-copy chunk"):
        chunks.parse_chunk(chunks.chunk(3, b"data"), chunks.COPY_MAGIC)

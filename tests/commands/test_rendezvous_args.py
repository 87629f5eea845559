"""`kafila rendezvous --max-sessions`: a table size that cannot be one is refused before anything binds."""

from __future__ import annotations

import pytest

from tests.conftest import run_kafila

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_rendezvous_refuses_a_table_size_that_is_not_one(value: str) -> None:
    out = run_kafila("rendezvous", "--port", "1", f"--max-sessions={value}", timeout=60)
    assert out.returncode == 2 and "--max-sessions must be a whole number of at least 1" in out.stderr, out.stderr

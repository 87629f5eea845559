"""EMULATION `--link-delay`: a value that cannot be a one-way delay is refused before anything starts."""

from __future__ import annotations

import pytest

from tests.conftest import run_kafila

pytestmark = pytest.mark.fast

CODE = "k7q2m9xd-4f8t-zr2w-9mhc-qp3a"  # well formed; nothing runs far enough to use it


@pytest.mark.parametrize("value", ["5000", "-3", "nan"])
def test_join_refuses_a_link_delay_out_of_range(value: str) -> None:
    out = run_kafila("join", CODE, f"--link-delay={value}", timeout=60)
    assert out.returncode == 1 and "--link-delay is milliseconds from 0 to 1000" in out.stderr, out.stderr


@pytest.mark.parametrize(("value", "says"), [("20,abc", "take comma-separated numbers"),
                                             ("20,30", "one --link-delay for every member or one per member"),
                                             ("2000", "one --link-delay for every member or one per member")])
def test_demo_refuses_link_delays_it_cannot_give_its_members(value: str, says: str) -> None:
    out = run_kafila("demo", "--prompt", "hi", f"--link-delay={value}", timeout=60)
    assert out.returncode == 1 and says in out.stderr, out.stderr

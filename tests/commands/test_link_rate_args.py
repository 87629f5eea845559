"""EMULATION `--link-rate`: join, host and demo refuse a value that cannot be a connection's rate, in one line."""

from __future__ import annotations

import pytest

from tests.conftest import run_kafila

pytestmark = pytest.mark.fast

CODE = "k7q2m9xd-4f8t-zr2w-9mhc-qp3a"  # well formed; nothing runs far enough to use it


@pytest.mark.parametrize(("command", "value"), [(("join", CODE), "0"), (("join", CODE), "fast"),
                                                (("host",), "80/"), (("demo", "--prompt", "hi"), "1/2/3")])
def test_a_bad_link_rate_is_refused_before_anything_starts(command: tuple[str, ...], value: str) -> None:
    out = run_kafila(*command, f"--link-rate={value}", timeout=60)
    assert out.returncode == 1, out.stderr
    assert "--link-rate is Mbit/s (EMULATION), one number or UP/DOWN" in out.stderr and \
        len(out.stderr.strip().splitlines()) == 1, out.stderr

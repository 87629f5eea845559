"""EMULATION: a member's slow-down changing while it serves (`--throttle-schedule`)."""

from __future__ import annotations

import time

import pytest

from kafila.errors import SessionError
from kafila.session.emulation import Throttle, parse_schedule

pytestmark = pytest.mark.fast


def test_a_schedule_steps_from_first_serving_on() -> None:
    steps = parse_schedule("0:1, 60:4,90:2.5")
    assert steps == ((0.0, 1.0), (60.0, 4.0), (90.0, 2.5))
    throttle = Throttle(steps)
    assert throttle() == 1.0  # not serving yet: the first step
    throttle.start()
    first = throttle.started
    throttle.start()  # a later admission (a new epoch) does not restart the clock
    assert throttle.started == first
    assert first is not None
    for elapsed, factor in ((0.0, 1.0), (59.0, 1.0), (61.0, 4.0), (95.0, 2.5)):
        throttle.started = time.monotonic() - elapsed
        assert throttle() == factor, elapsed


@pytest.mark.parametrize("text, why", [
    ("1:2", "start at 0"), ("0:1,30:2,30:3", "increase"), ("0:1,nan:2", "increase"), ("0:1,inf:2", "increase"),
    ("0:1,60:0.5", "at least 1"), ("0:1,60:inf", "at least 1"),
    ("0:1,sixty:4", "SECONDS:FACTOR"), ("0:1,60", "SECONDS:FACTOR"),
])
def test_a_bad_schedule_is_named(text: str, why: str) -> None:
    with pytest.raises(SessionError, match=why):
        parse_schedule(text)

"""What every parser's fuzz test checks of the bytes it is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kafila.errors import ProtocolError

T = TypeVar("T")


def refused_or_checked(data: bytes, decode: Callable[[bytes], T], check: Callable[[bytes, T], None]) -> None:
    """`decode` refuses `data` with a ProtocolError (nothing else escapes it), or what it accepts passes `check`."""
    try:
        got = decode(data)
    except ProtocolError:
        return
    check(data, got)

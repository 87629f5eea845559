"""Stages on one machine take turns on its cores: one holder at a time, and a killed holder frees the turn."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kafila.session.ring.compute_turn import ComputeTurn

pytestmark = pytest.mark.fast

HOLD = """
import sys, time
from pathlib import Path
from kafila.session.ring.compute_turn import ComputeTurn
with ComputeTurn(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def _taken_in_thread(turn: ComputeTurn) -> tuple[threading.Thread, threading.Event]:
    entered = threading.Event()

    def take() -> None:
        with turn:
            entered.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, entered


def test_one_stage_at_a_time(tmp_path: Path) -> None:
    a, b = ComputeTurn(tmp_path), ComputeTurn(tmp_path)
    try:
        with a:
            thread, entered = _taken_in_thread(b)
            assert not entered.wait(0.5), "a second stage computed while the first held the turn"
        thread.join(30)
        assert entered.is_set(), "the turn was not passed on when the first stage let it go"
    finally:
        a.close()
        b.close()


def test_a_killed_holder_frees_the_turn(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    turn = ComputeTurn(tmp_path)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        thread, entered = _taken_in_thread(turn)
        assert not entered.wait(0.5), "the turn was taken while another process held it"
        holder.kill()
        thread.join(30)
        assert entered.is_set(), "a killed process left the machine's turn held"
    finally:
        holder.kill()
        holder.wait(30)
        turn.close()

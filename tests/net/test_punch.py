"""The punch state machine with two in-memory peers, emulated NAT filters and an injected clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kafila.net import wire
from kafila.net.punch import RELAY_PATH, PunchConfig, Puncher, PunchState
from kafila.net.trust import punch_mac

pytestmark = pytest.mark.fast

KEY = b"k" * 32
A_ID, B_ID = b"A" * 8, b"B" * 8


def run(
    a: Puncher, b: Puncher, a_addr: Callable[[tuple], tuple], b_addr: Callable[[tuple], tuple],
    a_accepts: Callable[[tuple], bool], b_accepts: Callable[[tuple], bool], seconds: float = 4.0,
) -> None:
    """a_addr(dst): the source address b sees for a packet a sends to dst (the NAT mapping)."""
    sent_a: set = set()
    sent_b: set = set()
    t = 0.0
    a.start(t)
    inbox: list = []
    while t < seconds:
        for _me, other, to_addr, sent, out in ((a, b, a_addr, sent_a, a.poll(t)), (b, a, b_addr, sent_b, b.poll(t))):
            for data, dst in out:
                frame = wire.decode(data)
                assert isinstance(frame, wire.Punch)
                if dst == RELAY_PATH:
                    inbox.append((other, frame, RELAY_PATH))
                    continue
                sent.add(dst)
                inbox.append((other, frame, to_addr(dst), dst))
        while inbox:
            item = inbox.pop(0)
            target, frame = item[0], item[1]
            if item[2] == RELAY_PATH:
                replies = target.on_frame(frame, RELAY_PATH, t)
                src_fn = a_addr if target is a else b_addr
            else:
                src, dst = item[2], item[3]
                accepts = b_accepts if target is b else a_accepts
                if not accepts(src):
                    continue
                assert target.valid(frame)
                replies = target.on_frame(frame, src, t)
                src_fn = a_addr if target is a else b_addr
            other = b if target is a else a
            for data, d in replies:
                f = wire.decode(data)
                assert isinstance(f, wire.Punch)
                if d == RELAY_PATH:
                    inbox.append((other, f, RELAY_PATH))
                else:
                    (sent_a if target is a else sent_b).add(d)
                    inbox.append((other, f, src_fn(d), d))
        t += 0.01


def pair(window: float = 3.0) -> tuple[Puncher, Puncher]:
    cfg = PunchConfig(window_s=window)
    a = Puncher(A_ID, B_ID, KEY, [("100.64.0.12", 2000)], cfg)
    b = Puncher(B_ID, A_ID, KEY, [("100.64.0.11", 1000)], cfg)
    return a, b


def ack_for(b: Puncher, punch: bytes, src: tuple, now: float) -> wire.Punch:
    """The PUNCH_ACK b sends back for a PUNCH that reached it from src."""
    frame = wire.decode(punch)
    assert isinstance(frame, wire.Punch)
    acks = [wire.decode(d) for d, dst in b.on_frame(frame, src, now) if d[0] == wire.PUNCH_ACK and dst == src]
    assert len(acks) == 1 and isinstance(acks[0], wire.Punch)
    return acks[0]


def test_ordinary_pair_goes_direct() -> None:
    a, b = pair()
    sent_by_a: set = set()
    sent_by_b: set = set()

    def a_addr(dst: tuple) -> tuple:
        sent_by_a.add(dst)
        return ("100.64.0.11", 1000)

    def b_addr(dst: tuple) -> tuple:
        sent_by_b.add(dst)
        return ("100.64.0.12", 2000)

    # address-and-port-dependent filtering: only from endpoints we already sent to
    run(a, b, a_addr, b_addr, lambda src: src in sent_by_a, lambda src: src in sent_by_b)
    assert a.state == b.state == PunchState.DIRECT
    assert a.direct == ("100.64.0.12", 2000) and b.direct == ("100.64.0.11", 1000)


def test_permissive_meets_restrictive_through_the_reflexive_answer() -> None:
    a, b = pair()  # a permissive, b restrictive (a fresh port per destination)

    def a_addr(dst: tuple) -> tuple:
        return ("100.64.0.11", 1000)

    def b_addr(dst: tuple) -> tuple:
        return ("100.64.0.12", 30000 + dst[1] % 1000)

    sent_by_b = {("100.64.0.11", 1000)}
    run(a, b, a_addr, b_addr, lambda src: True, lambda src: src in sent_by_b)
    assert a.state == b.state == PunchState.DIRECT
    assert a.direct == ("100.64.0.12", 30000)  # learned from where the punch really came from


def test_restrictive_pair_falls_back_to_relay_after_the_window() -> None:
    a, b = pair(window=1.0)
    run(a, b, lambda d: ("100.64.0.11", 5000 + d[1] % 100), lambda d: ("100.64.0.12", 6000 + d[1] % 100),
        lambda s: False, lambda s: False, seconds=1.5)
    assert a.state == b.state == PunchState.RELAY and a.direct is None


def test_bad_mac_or_wrong_peer_is_not_valid() -> None:
    a, b = pair()
    a.start(0.0)
    data, _ = a.poll(0.0)[0]
    frame = wire.decode(data)
    assert isinstance(frame, wire.Punch) and b.valid(frame)
    forged = wire.Punch(frame.kind, frame.sender, frame.receiver, frame.stamp, frame.nonce, b"\0" * 16)
    assert not b.valid(forged)
    assert not a.valid(frame)  # a's own frame is not from a's peer


def test_direct_path_lost_falls_back() -> None:
    a, b = pair()
    a.start(0.0)
    punch = next(data for data, dst in a.poll(0.0) if dst == ("100.64.0.12", 2000))
    f = ack_for(b, punch, ("100.64.0.11", 1000), 0.05)
    a.on_frame(f, ("100.64.0.12", 2000), 0.1)
    assert a.state == PunchState.DIRECT
    a.poll(10.0)
    assert a.state == PunchState.DIRECT
    a.poll(20.0)
    assert a.state == PunchState.RELAY


A_ADDR, B_ADDR = ("100.64.0.11", 1000), ("100.64.0.12", 2000)
ELSEWHERE = ("203.0.113.5", 80)


def punch_frame(data: bytes) -> wire.Punch:
    frame = wire.decode(data)
    assert isinstance(frame, wire.Punch)
    return frame


def test_a_replayed_ack_from_another_address_pins_nothing() -> None:
    a, b = pair()
    a.start(0.0)
    punch = next(data for data, dst in a.poll(0.0) if dst == B_ADDR)
    ack = ack_for(b, punch, A_ADDR, 0.01)
    assert a.on_frame(ack, ELSEWHERE, 0.02) == []  # the ACK answers a PUNCH sent to B_ADDR, not to ELSEWHERE
    assert a.state == PunchState.PUNCHING and a.direct is None and ELSEWHERE not in a.candidates
    a.on_frame(ack, B_ADDR, 0.03)  # the real one, from where the PUNCH went
    assert a.state == PunchState.DIRECT and a.direct == B_ADDR
    a.poll(20.0)  # the peer went silent: the direct path is lost
    assert a.state == PunchState.RELAY
    for src in (B_ADDR, ELSEWHERE):  # the old ACK, replayed, brings nothing back
        assert a.on_frame(ack, src, 20.1) == []
    assert a.state == PunchState.RELAY and a.direct is None


def test_an_ack_for_a_punch_never_sent_or_long_ago_pins_nothing() -> None:
    a, b = pair()
    a.start(0.0)
    punch = next(data for data, dst in a.poll(0.0) if dst == B_ADDR)
    ack = ack_for(b, punch, A_ADDR, 0.01)
    assert a.on_frame(ack, B_ADDR, a.config.ack_window_s + 0.1) == []  # too late to prove the path now
    assert a.state != PunchState.DIRECT
    nonce = b"x" * 8  # a well-MAC'd, fresh ACK for a nonce a never issued
    unsolicited = wire.Punch(wire.PUNCH_ACK, B_ID, A_ID, 1, nonce, punch_mac(KEY, wire.PUNCH_ACK, B_ID, A_ID, 1, nonce))
    assert a.valid(unsolicited) and a.fresh(unsolicited)
    assert a.on_frame(unsolicited, B_ADDR, 0.5) == [] and a.state != PunchState.DIRECT


def test_a_replayed_punch_with_a_spoofed_source_causes_no_burst_and_adds_no_candidate() -> None:
    a, b = pair()
    b.start(0.0)
    captured = punch_frame(next(data for data, dst in b.poll(0.0) if dst == A_ADDR))
    first = a.on_frame(captured, B_ADDR, 0.01)  # the genuine delivery: answered, a starts punching
    assert {dst for _, dst in first} >= {B_ADDR}
    assert a.on_frame(captured, ELSEWHERE, 0.02) == [] and ELSEWHERE not in a.candidates  # replayed at once
    a.poll(30.0)
    assert a.state == PunchState.RELAY  # a's punching has long ended
    assert a.on_frame(captured, ELSEWHERE, 30.0) == [] and ELSEWHERE not in a.candidates  # replayed later
    assert a.state == PunchState.RELAY  # the replay did not restart punching
    assert a.poll(30.1) == []


def test_a_stale_punch_never_heard_before_is_refused_but_reordering_within_the_window_is_not() -> None:
    a, b = pair()
    b.start(0.0)
    old = punch_frame(next(data for data, dst in b.poll(0.0) if dst == A_ADDR))  # captured, never delivered
    b.poll(10.0)
    b.state = PunchState.IDLE
    b.start(10.0)
    newer, newest = (punch_frame(next(d for d, dst in b.poll(t) if dst == A_ADDR)) for t in (10.0, 10.1))
    assert a.on_frame(newest, B_ADDR, 10.2) != []
    assert a.on_frame(newer, B_ADDR, 10.2) != []  # older, but inside the window and not seen: accepted
    assert a.on_frame(old, ELSEWHERE, 10.3) == []  # 10 s older than the newest heard: stale
    assert ELSEWHERE not in a.candidates


def test_learned_candidates_keep_the_newest_and_never_evict_the_announced() -> None:
    """Addresses learned from verified punches fill the slots the announced ones leave, newest kept: a peer whose
    mapping keeps changing is still punched at its latest, and its announced addresses are always tried."""
    announced = [("100.64.0.11", 1000), ("10.1.0.2", 1000)]
    b = Puncher(B_ID, A_ID, KEY, announced, PunchConfig())
    a = Puncher(A_ID, B_ID, KEY, [("100.64.0.12", 2000)], PunchConfig())
    a.start(0.0)
    t = 0.0
    for port in range(30000, 30011):  # eleven verified punches, each from a fresh mapping of a's NAT
        t += PunchConfig().interval_s  # a's next scheduled PUNCH
        data = next(d for d, dst in a.poll(t) if dst != RELAY_PATH)
        frame = wire.decode(data)
        assert isinstance(frame, wire.Punch)
        b.on_frame(frame, ("100.64.0.11", port), t)
    assert b.candidates[:2] == announced and len(b.candidates) == PunchConfig().max_candidates
    assert ("100.64.0.11", 30010) in b.candidates  # the newest mapping, punched although the slots were full
    assert ("100.64.0.11", 30000) not in b.candidates  # the oldest learned gave way
    punched = {dst for _, dst in b.poll(t + 1.0)}
    assert set(announced) <= punched and ("100.64.0.11", 30010) in punched

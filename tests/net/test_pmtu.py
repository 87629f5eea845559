"""Path MTU search: the search alone, then on the endpoint core over a fake path that drops datagrams over a size."""

from __future__ import annotations

import random

import pytest

from kafila.net import wire
from kafila.net.core import CoreConfig
from kafila.net.pmtu import BASE, DEFAULT_CEILING, LIMIT, PmtuConfig, PmtuSearch, PmtuState
from kafila.net.quic import PinnedQuicConnection
from tests.net.test_core import RELAY, Member, Net, open_link, pair, transfer

pytestmark = pytest.mark.fast


def settle(search: PmtuSearch, carries: int, now: float = 0.0) -> list[int]:
    """Run a search against a path that carries datagrams up to `carries` bytes; the sizes it probed."""
    probed = []
    while (size := search.probe_due(now)) is not None:
        probed.append(size)
        if size <= carries:
            search.on_acked(size, search.generation, now)
        else:
            search.on_lost(size, search.generation, now)
    return probed


@pytest.mark.parametrize("carries", [1200, 1201, 1250, 1280, 1350, 1451, 1452, 9000])
def test_the_search_ends_within_a_step_below_what_the_path_carries(carries: int) -> None:
    config = PmtuConfig()
    search = PmtuSearch(config)
    search.start(0.0)
    probed = settle(search, carries)
    assert search.state is PmtuState.DONE
    truth = min(carries, DEFAULT_CEILING)
    assert truth - config.step < search.size <= truth
    assert probed[0] == DEFAULT_CEILING  # the common case first: one round trip when the path carries the maximum
    assert probed.count(probed[-1]) <= config.max_probes
    # binary search: a handful of sizes, each lost at most max_probes times
    assert len(set(probed)) <= 6 and len(probed) <= 6 * config.max_probes


def test_a_lost_probe_is_retried_before_the_size_counts_as_too_big() -> None:
    search = PmtuSearch(PmtuConfig(max_probes=3))
    search.start(0.0)
    for _ in range(2):
        assert search.probe_due(0.0) == DEFAULT_CEILING
        search.on_lost(DEFAULT_CEILING, search.generation, 0.0)
    assert search.probe_due(0.0) == DEFAULT_CEILING  # two losses: still the same size
    search.on_acked(DEFAULT_CEILING, search.generation, 0.0)  # the third try got through
    assert search.size == DEFAULT_CEILING and search.state is PmtuState.DONE


def test_only_one_probe_at_a_time_and_stale_outcomes_are_ignored() -> None:
    search = PmtuSearch()
    search.start(0.0)
    size = search.probe_due(0.0)
    assert size == DEFAULT_CEILING and search.probe_due(0.0) is None  # the first is still out
    old = search.generation
    search.start(1.0)  # a new path
    search.on_acked(DEFAULT_CEILING, old, 1.0)  # the old path's answer says nothing about the new one
    assert search.size == BASE


def test_a_black_hole_falls_back_to_the_base_and_searches_again_later() -> None:
    config = PmtuConfig(raise_s=60.0)
    search = PmtuSearch(config)
    search.start(0.0)
    settle(search, 9000)
    assert search.size == DEFAULT_CEILING and search.next_wakeup() is None  # at the maximum: nothing to raise
    search.on_black_hole(10.0)
    assert search.size == BASE and search.probe_due(20.0) is None
    assert search.next_wakeup() == 70.0
    settle(search, 1300, now=70.0)
    assert 1300 - config.step < search.size <= 1300


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="base <= maximum"):
        PmtuConfig(maximum=1100)
    with pytest.raises(ValueError, match="base <= maximum"):
        PmtuConfig(maximum=LIMIT + 1)


@pytest.mark.parametrize(("ceiling", "carries"), [(8972, 9000), (8972, 4000), (16383, 65508), (65508, 1500),
                                                  (1392, 1500), (1100, 9000)])
def test_a_path_is_searched_up_to_its_own_ceiling(ceiling: int, carries: int) -> None:
    """A route's MTU bounds its path (jumbo frames, loopback, a VPN's smaller one); LIMIT bounds every path,
    and no ceiling goes below QUIC's base."""
    config = PmtuConfig()
    search = PmtuSearch(config)
    search.start(0.0, ceiling)
    probed = settle(search, carries)
    top = max(BASE, min(ceiling, LIMIT))
    truth = min(carries, top)
    assert search.ceiling == top and max(probed, default=top) <= top
    assert truth - config.step < search.size <= truth
    if truth > BASE:
        assert probed[0] == top  # the route's own size first: one round trip when the path carries it
    assert len(set(probed)) <= 11  # binary search over at most LIMIT - BASE bytes in 16-byte steps
    # the raise timer (RFC 8899 PMTU_RAISE_TIMER): armed raise_s after the search ended (at 0) below the
    # path's ceiling, where the path may later carry more; not armed at the ceiling, where there is no more
    assert search.next_wakeup() == (None if truth == top else config.raise_s)


def test_the_raise_timer_searches_up_to_the_paths_ceiling_again() -> None:
    config = PmtuConfig(raise_s=60.0)
    search = PmtuSearch(config)
    search.start(0.0, 8972)
    settle(search, 3000)
    assert search.next_wakeup() == 60.0  # below the ceiling: tried again later
    assert settle(search, 9000, now=60.0)[0] == 8972
    assert search.size == 8972


# ---- on the endpoint core, over a fake path -------------------------------------------------------------


class SmallPath(Net):
    """A Net whose every hop drops datagrams over `mtu` bytes (relay envelopes included), as a router would."""

    def __init__(self, mtu: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.mtu = mtu
        self.dropped_big = 0

    def send(self, src: tuple[str, int], dst: tuple[str, int], data: bytes) -> None:
        if len(data) > self.mtu:
            self.log.append((src, dst, data))
            self.dropped_big += 1
            return
        super().send(src, dst, data)


def data_sizes(net: Net, src: Member) -> list[int]:
    """Sizes of the datagrams src sent straight to a peer, relay envelopes removed."""
    return [len(d) - (9 if dst == RELAY else 0) for s, dst, d in net.log if s == src.addr]


def searched(net: Net, a: Member, conn: PinnedQuicConnection, b: Member, incoming: PinnedQuicConnection) -> bool:
    """Run until both ends' searches are done."""
    def done() -> bool:
        ours, theirs = a.core.mtu_search(conn), b.core.mtu_search(incoming)
        return ours is not None and theirs is not None and ours.state == theirs.state == PmtuState.DONE
    return net.run(done, 30)


def linked(net: Net, **kw: object) -> tuple[Member, Member, PinnedQuicConnection, PinnedQuicConnection]:
    a, b = pair(net, **kw)
    conn, incoming = open_link(net, a, b)
    assert net.run(lambda: a.core.path_to(b.core.member_id) == "direct", 5)
    return a, b, conn, incoming


@pytest.mark.parametrize("mtu", [1300, 1452, 1500])
def test_the_core_raises_the_datagram_size_only_as_far_as_the_path_carries(mtu: int) -> None:
    net = SmallPath(mtu)
    a, b, conn, incoming = linked(net)
    payload = random.Random(1).randbytes(300_000)
    transfer(net, a, conn, b, incoming, payload)
    transfer(net, b, incoming, a, conn, payload[::-1])
    assert searched(net, a, conn, b, incoming)
    truth = min(mtu, DEFAULT_CEILING)
    for c in (conn, incoming):
        assert truth - 16 < c.datagram_size <= truth, c.datagram_size
    assert max(data_sizes(net, a)) <= max(DEFAULT_CEILING, truth)
    if mtu >= DEFAULT_CEILING:
        assert net.dropped_big == 0
    else:  # only probes were ever too big: a handful, however much data went
        probes = sum(s.probes_sent for s in (a.core.mtu_search(conn), b.core.mtu_search(incoming)) if s is not None)
        assert 0 < net.dropped_big <= probes <= 2 * 5 * PmtuConfig().max_probes


def test_sizes_found_on_the_relay_are_searched_again_on_the_direct_path() -> None:
    """The relay adds a 9-byte envelope: a path of 1,400 carries 1,391-byte datagrams relayed, 1,400 direct."""
    net = SmallPath(1400)
    a, b = pair(net, allow_direct=False)
    conn, incoming = open_link(net, a, b)
    transfer(net, a, conn, b, incoming, random.Random(2).randbytes(50_000))
    assert searched(net, a, conn, b, incoming)
    assert 1391 - 16 < conn.datagram_size <= 1391
    net2 = SmallPath(1400)
    a, b, conn, incoming = linked(net2)
    transfer(net2, a, conn, b, incoming, random.Random(2).randbytes(50_000))
    assert searched(net2, a, conn, b, incoming)
    assert 1400 - 16 < conn.datagram_size <= 1400


def test_blind_large_datagrams_stall_where_probed_ones_do_not() -> None:
    """The guard on the tests above: without a search, a connection set to 1,452 bytes on a 1,300 path stalls."""
    net = SmallPath(1300)
    a, b, conn, incoming = linked(net, pmtu=None)
    conn.set_datagram_size(DEFAULT_CEILING)
    a.core.send_stream(conn, b"x" * 100_000)
    assert not net.run(lambda: len(b.received.get(incoming, b"")) >= 100_000, 5)
    assert conn.datagram_size == DEFAULT_CEILING


def test_a_path_that_shrinks_is_a_black_hole_and_the_size_falls_back() -> None:
    net = SmallPath(1500)
    a, b, conn, incoming = linked(net, pmtu=PmtuConfig(raise_s=5.0))
    transfer(net, a, conn, b, incoming, b"y" * 50_000)
    assert conn.datagram_size == DEFAULT_CEILING
    net.mtu = 1300  # a route change: the path no longer carries what it did
    transfer(net, a, conn, b, incoming, random.Random(4).randbytes(200_000), limit_s=60)
    search = a.core.mtu_search(conn)
    assert search is not None
    # the raise timer searched again
    assert net.run(lambda: conn.datagram_size > BASE and search.state is PmtuState.DONE, 30)
    assert 1300 - 16 < conn.datagram_size <= 1300


def test_config_off_keeps_quics_minimum() -> None:
    net = SmallPath(1500)
    a, b, conn, incoming = linked(net, pmtu=None)
    transfer(net, a, conn, b, incoming, b"z" * 50_000)
    assert conn.datagram_size == BASE and max(data_sizes(net, a)) <= BASE


def test_core_config_default_searches() -> None:
    assert CoreConfig().pmtu == PmtuConfig()


def test_a_direct_path_is_searched_to_its_routes_size_and_the_relay_to_its_envelope() -> None:
    """With the route's MTU known (here 9,000: jumbo frames), a direct path's datagrams grow past Ethernet's;
    when the direct path is lost, the edge goes on through the relay at sizes its envelope carries."""
    net = SmallPath(9000)
    # an idle timeout past the puncher's 16 s without an answer, so the connection outlives the direct path
    a, b, conn, incoming = linked(net, route_limit=lambda addr: 9000, idle_timeout_s=30.0)
    payload = random.Random(5).randbytes(400_000)
    transfer(net, a, conn, b, incoming, payload)
    transfer(net, b, incoming, a, conn, payload[::-1])
    assert searched(net, a, conn, b, incoming)
    for c in (conn, incoming):
        assert 9000 - 16 < c.datagram_size <= 9000, c.datagram_size
    net.log.clear()
    net.blocked = lambda src, dst: True  # the direct path is gone: the puncher falls back to the relay
    transfer(net, a, conn, b, incoming, random.Random(6).randbytes(300_000), limit_s=60)
    assert a.core.path_to(b.core.member_id) == "relay"
    assert conn.datagram_size <= DEFAULT_CEILING
    relayed = [d for s, dst, d in net.log if s == a.addr and dst == RELAY]
    assert relayed and max(len(d) for d in relayed) <= wire.MAX_DATAGRAM


def test_without_a_route_size_a_direct_path_stops_at_the_default_ceiling() -> None:
    net = SmallPath(9000)
    a, b, conn, incoming = linked(net)  # CoreConfig's route_limit None: nothing known of the route
    transfer(net, a, conn, b, incoming, random.Random(7).randbytes(100_000))
    assert searched(net, a, conn, b, incoming)
    assert conn.datagram_size == DEFAULT_CEILING

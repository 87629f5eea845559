"""Which session not in use the rendezvous drops when its table is full: one of the network holding the most.

A stranger can make sessions look busy from many ports and addresses of its own network, but it cannot make
its network hold fewer sessions: so the next to go is from the creator's network (rendezvous.limits.net_key)
with the most live sessions, its idlest one no second address joined, else its idlest one no second site
joined. A new host's network holds one session or a few, a flood's holds its share; between networks holding
as many, the one idle longest gives one up. Before, the idlest session no second address joined went first
anywhere: a flood whose sessions were all joined from two of its ports dropped a new host's session, waiting
for its members, as soon as it made another of its own (tests/net/test_flood_pins.py).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator


class Evictable:
    """Live sessions counted per creator's network, and those not in use, in the order they would be dropped."""

    def __init__(self) -> None:
        self.live: Counter[str] = Counter()  # live sessions per creator's network
        # per network, its sessions not in use, idlest first: whether a second address joined each (a dict, not an
        # OrderedDict: a third of the size, and a network holds at most its share of sessions to reorder)
        self._nets: dict[str, dict[str, bool]] = {}
        # networks with a session not in use, by their live sessions; in each, the idlest network first
        self._by_live: dict[int, OrderedDict[str, None]] = {}
        self._top = 0  # no network holds more (a bound: it is lowered as it is found empty)

    def add(self, sid: str, net: str) -> None:
        """A new session `sid` from network `net`: not in use."""
        self._unfile(net)
        self.live[net] += 1
        self._nets.setdefault(net, {})[sid] = False
        self._file(net)

    def second_address(self, sid: str, net: str) -> None:
        """A second address joined `sid`: it goes after its network's sessions that none joined."""
        own = self._nets.get(net)
        if own is not None and sid in own:
            own[sid] = True

    def in_use(self, sid: str, net: str) -> None:
        """A second site joined `sid`: it is never dropped for room."""
        self._forget(sid, net)

    def touch(self, sid: str, net: str) -> None:
        """Something happened in `sid`: it, and its network among those holding as many, go last."""
        own = self._nets.get(net)
        if own is not None and sid in own:
            own[sid] = own.pop(sid)
            self._by_live[self.live[net]].move_to_end(net)

    def gone(self, sid: str, net: str) -> None:
        """Session `sid` ended."""
        self._forget(sid, net)
        self._unfile(net)
        self.live[net] -= 1
        if self.live[net] <= 0:
            del self.live[net]
        self._file(net)

    def candidates(self) -> Iterator[str]:
        """Sessions not in use, the first to drop first: a generator over the live order, so take one, drop it,
        and ask again (it cannot go on once anything changed)."""
        while self._top > 0 and self._top not in self._by_live:
            self._top -= 1
        for count in range(self._top, 0, -1):
            for net in self._by_live.get(count, ()):
                own = self._nets[net]
                yield from [sid for sid, addressed in own.items() if not addressed]
                yield from [sid for sid, addressed in own.items() if addressed]

    def _forget(self, sid: str, net: str) -> None:
        own = self._nets.get(net)
        if own is None or sid not in own:
            return
        self._unfile(net)
        del own[sid]
        if not own:
            del self._nets[net]
        self._file(net)

    def _unfile(self, net: str) -> None:
        if net in self._nets:
            bucket = self._by_live[self.live[net]]
            del bucket[net]
            if not bucket:
                del self._by_live[self.live[net]]

    def _file(self, net: str) -> None:
        if net in self._nets:
            count = self.live[net]
            self._by_live.setdefault(count, OrderedDict())[net] = None
            self._top = max(self._top, count)

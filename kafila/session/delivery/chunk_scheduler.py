"""Which chunk of the model to ask of which source, several at once (sans-I/O: no sockets, no clock).

The caller adds sources (peers serving the verified chunks they hold, a public URL, the host), says which
chunks it wants (`want`, in tiers: the header before the stage's chunks before a copy's), and pumps:
`next_requests(now)` hands out requests up to each source's `slots`; it reports what became of each
(`received`, `refused`, `failed`) and calls `poll(now)` when `next_wakeup()` comes. The rules:

- a chunk is asked only of a source that holds it; among the chunks a source holds, the earliest tier,
  then the rarest (the fewest live peers hold it, so rare chunks spread before their holders leave),
  then the lowest index; sources are served fastest first (measured rate; an unmeasured one first);
- the host is asked for a chunk only when no live peer or URL holds it, so its uplink carries each byte
  at most once while others can;
- a source whose chunk fails its hash is dropped for the rest of the session and never asked again;
- a source with a request outstanding and nothing arriving for `stall_s` is stalled: its outstanding
  chunks are asked elsewhere, and it rests for `rest_s` (a failure rests it likewise). A chunk that
  arrives late from it is still taken (the caller's store ignores a second copy).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class Kind(Enum):
    PEER = "peer"
    URL = "url"
    HOST = "host"


@dataclass(frozen=True)
class Request:
    source: str
    chunk: int


@dataclass
class _Source:
    name: str
    kind: Kind
    holds: set[int] | None  # None: every chunk (a URL of the file, the host)
    slots: int
    rate: float | None = None  # bytes/s per request, an exponential average; None until measured
    outstanding: dict[int, float] = field(default_factory=dict)  # chunk -> when asked
    last_progress: float = 0.0
    resting_until: float = 0.0
    dropped: str | None = None  # why, once dropped

    def has(self, chunk: int) -> bool:
        return self.holds is None or chunk in self.holds

    def live(self, now: float) -> bool:
        return self.dropped is None and now >= self.resting_until


class ChunkScheduler:
    """Plans requests for the wanted chunks over the sources; see the module's rules."""

    def __init__(self, stall_s: float = 15.0, rest_s: float = 60.0) -> None:
        self.stall_s, self.rest_s = stall_s, rest_s
        self.sources: dict[str, _Source] = {}
        self._tier: dict[int, int] = {}  # wanted chunk -> its tier
        self.done: set[int] = set()
        self.log: list[str] = []  # what happened to sources, for the caller to show

    def add_source(self, name: str, kind: Kind, holds: Iterable[int] | None = None, slots: int = 4) -> None:
        """A source; `holds` the chunks a peer holds (None for a URL or the host: every chunk)."""
        if name in self.sources:
            raise ValueError(f"source {name} added twice")
        if (holds is None) == (kind is Kind.PEER):
            raise ValueError("a peer says which chunks it holds; a URL and the host hold every chunk")
        self.sources[name] = _Source(name, kind, None if holds is None else set(holds), slots)

    def peer_holds(self, name: str, chunks: Iterable[int]) -> None:
        """A peer verified more chunks (its stage, its copy growing)."""
        source = self.sources[name]
        assert source.holds is not None, "only peers say what they hold"
        source.holds.update(chunks)

    def want(self, chunks: Iterable[int]) -> None:
        """Chunks to fetch, after every chunk wanted before (a new tier)."""
        tier = max(self._tier.values(), default=-1) + 1
        for c in chunks:
            if c not in self._tier and c not in self.done:
                self._tier[c] = tier

    @property
    def complete(self) -> bool:
        return not self._tier

    def _outstanding(self) -> set[int]:
        return {c for s in self.sources.values() for c in s.outstanding}

    def next_requests(self, now: float) -> list[Request]:
        """Requests to send now: every free slot of every live source given its best pending chunk."""
        pending = set(self._tier) - self._outstanding()
        live = [s for s in self.sources.values() if s.live(now)]
        peers = [s for s in live if s.kind is Kind.PEER]
        others = [s for s in live if s.kind is not Kind.HOST]
        rarity = {c: sum(1 for s in peers if s.has(c)) for c in pending}
        elsewhere = {c for c in pending if any(s.has(c) for s in others)}  # the host leaves these to others
        ranked = sorted(pending, key=lambda c: (self._tier[c], rarity[c], c))
        out: list[Request] = []
        for source in sorted(live, key=lambda s: (s.kind is Kind.HOST, -(s.rate if s.rate is not None else 1e300))):
            free = source.slots - len(source.outstanding)
            for c in ranked:
                if free <= 0:
                    break
                if c not in pending or not source.has(c) or (source.kind is Kind.HOST and c in elsewhere):
                    continue
                if not source.outstanding:
                    source.last_progress = now  # the stall clock starts with its first request
                source.outstanding[c] = now
                pending.discard(c)
                free -= 1
                out.append(Request(source.name, c))
        return out

    def received(self, name: str, chunk: int, n_bytes: int, now: float) -> None:
        """`name`'s chunk arrived and verified (the caller stored it)."""
        source = self.sources[name]
        asked = source.outstanding.pop(chunk, None)
        source.last_progress = now
        if asked is not None and now > asked:
            rate = n_bytes / (now - asked)
            source.rate = rate if source.rate is None else 0.7 * source.rate + 0.3 * rate
        self._tier.pop(chunk, None)
        self.done.add(chunk)
        for other in self.sources.values():  # a copy asked elsewhere after a stall is no longer needed
            other.outstanding.pop(chunk, None)

    def refused(self, name: str, chunk: int, why: str = "") -> None:
        """`name` sent a chunk that failed its hash (or serves another file, `why`): it is dropped, its outstanding
        chunks asked elsewhere."""
        source = self.sources[name]
        if source.dropped is not None:
            return  # a request still in flight when it was dropped
        source.dropped = why or f"chunk {chunk} from {name} failed its sha256"
        source.outstanding.clear()
        self.log.append(f"dropped {name} for the rest of the session: {source.dropped}")

    def failed(self, name: str, chunk: int, now: float, why: str = "") -> None:
        """`name` could not send `chunk` (a network error): the chunk is asked elsewhere, the source rests."""
        source = self.sources[name]
        if source.outstanding.pop(chunk, None) is not None:
            self._rest(source, now, f"failed to send chunk {chunk}{': ' + why if why else ''}")

    def _rest(self, source: _Source, now: float, why: str) -> None:
        source.outstanding.clear()
        source.resting_until = now + self.rest_s
        self.log.append(f"{source.name} {why}; its chunks are asked elsewhere for {self.rest_s:g} s")

    def poll(self, now: float) -> None:
        """Stalled sources rest, their outstanding chunks freed for others."""
        for source in self.sources.values():
            if source.outstanding and now - source.last_progress >= self.stall_s:
                self._rest(source, now, f"stalled (nothing for {self.stall_s:g} s)")

    def next_wakeup(self, now: float) -> float | None:
        """When poll() may next find a stall, or a resting source wakes (None: nothing to wait for)."""
        times = [s.last_progress + self.stall_s for s in self.sources.values() if s.outstanding]
        times += [s.resting_until for s in self.sources.values() if s.dropped is None and s.resting_until > now]
        return min(times, default=None)

    def unreachable(self, now: float) -> list[int]:
        """Wanted chunks that no live source holds (they wait for a resting source, or a peer to get them)."""
        return sorted(c for c in self._tier if not any(s.live(now) and s.has(c) for s in self.sources.values()))

"""Predicted time to first token (TTFT) of a P-token prompt through the ring (issue 11, DESIGN §3).

The head cuts a prompt into C = ⌈P / B⌉ chunks of at most B = n_batch rows and sends chunk k+1 while
chunk k is still in later stages (kafila/session/ring/head.py), with at most D frames in the ring at once
(counted from the head's send until the head's own stage takes the frame back). A chunk visits the
stages in ring order after the head, then the head's own stage; after the last chunk the head
unembeds its last row and samples the first token.

TTFT is when the last chunk leaves the head's stage, plus the unembedding, found by stepping through the
prefill event by event (a few thousand events for the longest prompts): each stage is a first-come
first-served server; a link delays a chunk by its one-way latency; members on one machine (the demo
runs three on one) take turns on its cores, first come first served, for the compute part of a call
(an emulated slow-down is a sleep after it, which overlaps other stages' compute as a slower machine
would: kafila/session/ring/compute_turn.py); and the head sends chunk k only once fewer than D frames
are out. Closed forms are only bounds here: the flow shop's longest path is exact for machines of their
own and an open window, but with shared machines how the calls interleave decides the rest (on 20,000
random rings the bounds fell as low as 0.69 of the simulation, and a slowed Qwen3-30B-A3B ring took
1.3× what they said).

A stage's time for r rows is interpolated between its one-row (decode) time and its B-row (prefill)
time, both predicted by the cost model from the member's probe (straight lines: a chunk of r rows
pays the call's fixed costs once and the rows' compute in proportion). Those are times at the start of
a sequence (the probe's chunks sit at positions 0..B−1); a chunk that starts at position s also
attends to the s positions before it, in every block: llama.cpp's attention (without flash attention)
computes each row against every key of the cache, so each of its r rows costs `attn_s` per earlier
position (sliding-window layers too: their cache holds the whole context, masked, cost.kv_positions).
On SmolLM2 a 2,000-token prompt's attention
doubled its prefill; on an 8B model's wide blocks it is a few percent. The head's stage holds the model's
last layer, whose FFN llama.cpp computes only for the rows that return logits (it drops the others right
after that layer's attention): a chunk pays those weights at one row's cost, not its rows' (on a 3-block
file of Qwen3-32B's shapes about a quarter of the prompt's compute; on the real 64-layer model about 1 %).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from kafila.errors import PlanInputError
from kafila.planner.cost import edge_cost_ns, prefill_bytes, read_bytes, stage_time, unembed_seconds
from kafila.planner.placement import Placement
from kafila.planner.spec import Member, ModelSpec, Workload


@dataclass(frozen=True)
class PrefillStage:
    """One stage as a prompt chunk meets it."""

    name: str
    decode_s: float  # one row (without the head's unembedding)
    chunk_s: float  # n_batch rows
    machine: str = ""  # stages with the same non-empty id share one machine's cores
    throttle: float = 1.0  # emulated slow-down: 1/throttle of the stage time is compute, the rest a sleep
    link_s: float = 0.0  # one-way latency of the edge that brings a chunk to this stage
    attn_s: float = 0.0  # seconds each row of a call adds per earlier position, in whole-context layers
    # the same in layers that compute over at most `window` positions (a window-sized cache; the stage engine
    # keeps whole ones, so ring_ttft sets none)
    window_attn_s: float = 0.0
    window: int = 0

    def seconds(self, rows: int, n_batch: int, start: int = 0) -> float:
        """Seconds of a call of `rows` rows from position `start`: the line through (1, decode_s) and
        (n_batch, chunk_s), plus the rows' attention to the positions before `start`."""
        if n_batch <= 1:
            base = self.chunk_s * rows
        else:
            base = self.decode_s + max(self.chunk_s - self.decode_s, 0.0) / (n_batch - 1) * (rows - 1)
        return base + rows * (self.attn_s * start + self.window_attn_s * min(start, self.window))

    def compute_s(self, rows: int, n_batch: int, start: int = 0) -> float:
        """The part of `seconds` that occupies the machine's cores (an emulated slow-down only sleeps)."""
        return self.seconds(rows, n_batch, start) / self.throttle


@dataclass(frozen=True)
class TtftModel:
    """What TTFT depends on: the stages in the order a chunk visits them (the head's last), B, D, unembedding."""

    stages: tuple[PrefillStage, ...]
    n_batch: int
    depth: int  # frames in the ring at once (head.py: one per stage, one on the wire)
    unembed_s: float = 0.0  # the head's unembedding of the prompt's last row

    def __post_init__(self) -> None:
        if not self.stages:
            raise PlanInputError("ttft: a ring needs at least one stage")
        if self.n_batch < 1 or self.depth < 1:
            raise PlanInputError(f"ttft: n_batch and depth must be >= 1, got {self.n_batch} and {self.depth}")
        for s in self.stages:
            times = (s.decode_s, s.chunk_s, s.link_s, s.attn_s, s.window_attn_s)
            if not all(math.isfinite(v) and v >= 0 for v in times) or s.throttle < 1 or s.window < 0:
                raise PlanInputError(f"ttft: stage {s.name!r} has a negative or non-finite time, a throttle < 1 "
                                     "or a negative window")

    def predict(self, prompt_tokens: int, start: int = 0) -> float:
        """Seconds from a P-token prompt's arrival at the head to its first token (see the module's docstring);
        `start`: positions of the conversation already in the cache, which the prompt's rows attend to."""
        if prompt_tokens < 1:
            raise PlanInputError(f"ttft: a prompt has at least one token, got {prompt_tokens}")
        return _Prefill(self, _chunk_rows(prompt_tokens, self.n_batch), start).run() + self.unembed_s

    def stage_prefill(self, prompt_tokens: int) -> dict[str, tuple[float, float]]:
        """Each stage's seconds over all chunks of a P-token prompt: (as slowed, compute alone); their sum is
        what a ring that does not pipeline takes."""
        B = self.n_batch
        chunks = [(r, k * B) for k, r in enumerate(_chunk_rows(prompt_tokens, B))]  # (rows, start)
        return {s.name: (sum(s.seconds(r, B, a) for r, a in chunks), sum(s.compute_s(r, B, a) for r, a in chunks))
                for s in self.stages}

    def to_json(self) -> dict[str, Any]:
        return {"n_batch": self.n_batch, "depth": self.depth, "unembed_s": self.unembed_s,
                "stages": [asdict(s) for s in self.stages]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TtftModel:
        """The model back from `to_json` (as the plan JSON carries it); PlanInputError when malformed."""
        try:
            stages = tuple(PrefillStage(**s) for s in d["stages"])
            return cls(stages, int(d["n_batch"]), int(d["depth"]), float(d["unembed_s"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanInputError(f"plan ttft: malformed model ({exc})") from None


def _chunk_rows(prompt_tokens: int, n_batch: int) -> list[int]:
    """Rows of each chunk the head cuts a prompt into: n_batch each, the last one the rest."""
    return [min(n_batch, prompt_tokens - k * n_batch) for k in range(math.ceil(prompt_tokens / n_batch))]


class _Prefill:
    """One prompt's chunks stepped through the ring in time order (the module's docstring says what is modelled)."""

    def __init__(self, model: TtftModel, rows: list[int], start: int) -> None:
        B, self.stages = model.n_batch, model.stages
        # (seconds, compute seconds) of chunk k at stage i
        self.calls = [[(s.seconds(r, B, start + k * B), s.compute_s(r, B, start + k * B)) for s in self.stages]
                      for k, r in enumerate(rows)]
        self.window = model.depth
        self.sent = self.out = 0  # chunks the head sent, and those not yet back at its own stage
        self.queued: list[deque[int]] = [deque() for _ in self.stages]
        self.idle = [True] * len(self.stages)
        self.turns: dict[str, deque[tuple[int, int]]] = {}  # a machine's calls waiting for its cores
        self.computing: set[str] = set()  # machines whose cores a call holds
        self.events: list[tuple[float, int, Callable[..., None], tuple[int, int]]] = []
        self.order = itertools.count()  # events at one instant happen in the order they were scheduled
        self.finished = 0.0

    def run(self) -> float:
        """When the last chunk leaves the head's stage."""
        self._send(0.0)
        while self.events:
            t, _, step, (i, k) = heapq.heappop(self.events)
            step(t, i, k)
        return self.finished

    def _at(self, t: float, step: Callable[[float, int, int], None], i: int, k: int) -> None:
        heapq.heappush(self.events, (t, next(self.order), step, (i, k)))

    def _send(self, t: float) -> None:
        while self.sent < len(self.calls) and self.out < self.window:
            self._at(t + self.stages[0].link_s, self._arrive, 0, self.sent)
            self.sent += 1
            self.out += 1

    def _arrive(self, t: float, i: int, k: int) -> None:
        self.queued[i].append(k)
        self._take(t, i)

    def _take(self, t: float, i: int) -> None:
        if not self.idle[i] or not self.queued[i]:
            return
        k = self.queued[i].popleft()
        self.idle[i] = False
        if i == len(self.stages) - 1:  # the head's own stage takes its frame back: the window has room
            self.out -= 1
            self._send(t)
        machine = self.stages[i].machine
        if machine:
            self.turns.setdefault(machine, deque()).append((i, k))
            self._grant(t, machine)
        else:
            self._at(t + self.calls[k][i][1], self._computed, i, k)

    def _grant(self, t: float, machine: str) -> None:
        if machine in self.computing or not self.turns[machine]:
            return
        i, k = self.turns[machine].popleft()
        self.computing.add(machine)
        self._at(t + self.calls[k][i][1], self._computed, i, k)

    def _computed(self, t: float, i: int, k: int) -> None:
        if machine := self.stages[i].machine:
            self.computing.discard(machine)
            self._grant(t, machine)
        seconds, compute = self.calls[k][i]
        self._at(t + seconds - compute, self._done, i, k)  # an emulated slow-down sleeps off the cores

    def _done(self, t: float, i: int, k: int) -> None:
        self.idle[i] = True
        if i + 1 < len(self.stages):
            self._at(t + self.stages[i + 1].link_s, self._arrive, i + 1, k)
        elif k == len(self.calls) - 1:
            self.finished = t
        self._take(t, i)


def window_depth(m: int) -> int:
    """Frames the head keeps in a ring of m members at once: one per stage and one on the wire (head.py)."""
    return m + 1


def ring_ttft(placement: Placement, members: dict[str, Member], model: ModelSpec, workload: Workload
              ) -> TtftModel | None:
    """The TTFT model of a feasible placement; None when it has no ranges or a member measured no prefill.

    A member measured prefill at R = prefill_rows rows; a chunk of the session's B rows is read off the
    line through its one-row (decode) time and its R-row time. Its decode time here is one row's (MoE
    blocks read fewer experts than at the admitted concurrency); at R rows an MoE block computes its
    dense tensors and each row's k experts, at the member's routed-expert rate (cost.prefill_bytes).
    """
    if not placement.ranges or placement.head is None:
        return None
    order = placement.order
    if any(members[n].prefill_rows < 1 for n in order):
        return None
    one, prefix_one = read_bytes(model, 1), [0]
    for r in one:
        prefix_one.append(prefix_one[-1] + r)
    B = workload.batch
    stages = []
    for j, name in enumerate((*order[1:], order[0])):
        mem = members[name]
        a, e = placement.ranges[name]
        R = mem.prefill_rows
        reads_r = prefill_bytes(model, mem.prefill_bandwidth / mem.expert_rate(model.expert_type))
        decode = stage_time(mem.dispatch_s, mem.block_s, mem.bandwidth, e - a, prefix_one[e] - prefix_one[a])
        at_r = stage_time(mem.prefill_dispatch_s, mem.prefill_block_s, mem.prefill_bandwidth, e - a,
                          sum(reads_r[a:e]))
        if name == order[0] and e == model.k and model.last_ffn_bytes:
            # the head's stage: llama.cpp computes the last layer's FFN only for the rows that return logits
            # (none in a prompt's chunks but the last, one row there), so a chunk reads it at one row's cost
            rest = model.blocks_bytes[e - 1] - model.last_ffn_bytes  # read by every row
            ffn_r, ffn_one = max(reads_r[e - 1] - rest, 0), max(one[e - 1] - rest, 0)
            at_r += ffn_one / mem.bandwidth - ffn_r / mem.prefill_bandwidth
        chunk = PrefillStage(name, decode, at_r).seconds(B, R)  # B rows on the line through 1 and R rows
        prev = members[order[j]]  # the member that sends this stage its chunks (order[j] precedes it)
        link = edge_cost_ns(prev, mem) / 2e9 if len(order) > 1 else 0.0  # edge costs are round-trip figures
        # every block attends over its whole cache: sliding-window layers too, with a mask (cost.kv_positions)
        attn = mem.prefill_attn_s * model.attention_width * (e - a)
        stages.append(PrefillStage(name, decode, chunk, mem.machine, mem.throttle, link, attn_s=attn))
    head = members[order[0]]
    return TtftModel(tuple(stages), B, window_depth(len(order)), unembed_seconds(model.unembed_bytes, head))


def with_ttft(placement: Placement, members: dict[str, Member], model: ModelSpec, workload: Workload
              ) -> Placement:
    """The placement with its predicted TTFT for the workload's prompt length (and the model to predict others)."""
    ttft = ring_ttft(placement, members, model, workload) if placement.feasible else None
    if ttft is None:
        return placement
    return replace(placement, ttft={"prompt_tokens": workload.prompt_tokens,
                                    "seconds": ttft.predict(workload.prompt_tokens), "model": ttft.to_json()})


def plan_model(plan_json: dict[str, Any]) -> TtftModel | None:
    """The TTFT model a plan's JSON carries (None when the plan predicts none); PlanInputError when malformed."""
    ttft = plan_json.get("ttft")
    if not isinstance(ttft, dict) or not isinstance(ttft.get("model"), dict):
        return None
    return TtftModel.from_json(ttft["model"])


def predicted_ttft(plan_json: dict[str, Any], prompt_tokens: int) -> float | None:
    """TTFT for `prompt_tokens` from a plan's JSON (None when the plan predicts none)."""
    model = plan_model(plan_json)
    return None if model is None else model.predict(prompt_tokens)

"""Predicted time to first token (TTFT) of a P-token prompt through the ring (issue 11, DESIGN §3).

The head cuts a prompt into C = ⌈P / B⌉ chunks of at most B = n_batch rows and sends chunk k+1 while
chunk k is still in later stages (kafila/session/ring/head.py), with at most D frames in the ring at once
(counted from the head's send until the head's own stage takes the frame back). A chunk visits the
stages in ring order after the head, then the head's own stage; after the last chunk the head
unembeds its last row and samples the first token.

Every term below is a lower bound on when the last chunk can leave the head's stage, and TTFT is their
maximum plus the unembedding:

- the flow-shop critical path (stages are FIFO servers, links pure delays): the longest path through
  the chunk × stage grid, T[k][i] = max(T[k−1][i], T[k][i−1]) + t[k][i], plus every link's latency
  once (any path crosses each link once). For a ring whose stages run on machines of their own and a
  window that does not bind, this is the exact completion time (the grid's longest path is the flow
  shop's makespan);
- each machine that runs several stages (members may share one machine: the demo runs three on one):
  its stages do not compute in parallel, so it must do all its chunks' compute (the part of a stage
  time that is compute: emulated slow-downs are sleeps and overlap), after chunk 1 reaches its first
  stage and before the last chunk leaves its last stage;
- the window: frame k cannot be sent before frame k−D came back, which takes at least a lap
  (the non-head stages plus every link), so the laps of chunks C−1−D, C−1−2D, … pass before the last
  chunk is sent.

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

With stages sharing machines the maximum is still a lower bound, but not exact: how calls on one
machine interleave decides the rest (on 20,000 random rings with the head's window, the prediction
was at least 0.74 of an event-by-event simulation; tests/planner/test_ttft.py).
"""

from __future__ import annotations

import math
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
        B, st = self.n_batch, self.stages
        rows = _chunk_rows(prompt_tokens, B)
        C = len(rows)
        t = [[s.seconds(r, B, start + k * B) for s in st] for k, r in enumerate(rows)]  # chunk k at stage i
        links = sum(s.link_s for s in st)
        bounds = [links + _critical_path(t)]
        by_machine: dict[str, list[int]] = {}
        for j, s in enumerate(st):
            if s.machine:
                by_machine.setdefault(s.machine, []).append(j)
        for js in by_machine.values():
            if len(js) < 2:
                continue
            a, z = js[0], js[-1]
            work = sum(st[j].compute_s(r, B, start + k * B) for j in js for k, r in enumerate(rows))
            sleep_z = t[-1][z] - st[z].compute_s(rows[-1], B, start + (C - 1) * B)
            before = sum(t[0][:a]) + sum(s.link_s for s in st[:a + 1])  # links between its stages may overlap
            after = sleep_z + sum(t[-1][z + 1:]) + sum(s.link_s for s in st[z + 1:])
            bounds.append(before + work + after)
        # the last chunk waits for chunk C−1−D to come back, which waited for C−1−2D, ...: a lap each
        laps = sum(sum(t[k][:-1]) + links for k in range(C - 1 - self.depth, -1, -self.depth))
        bounds.append(laps + sum(t[-1][:-1]) + links + t[-1][-1])
        return max(bounds) + self.unembed_s

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


def _critical_path(t: list[list[float]]) -> float:
    """Longest path through the chunk × stage grid of call times t[k][i] (chunk k at stage i)."""
    done = [0.0] * len(t[0])  # when each stage finished the previous chunk
    for row in t:
        ready = 0.0
        for i, seconds in enumerate(row):
            ready = done[i] = max(done[i], ready) + seconds
    return done[-1]


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

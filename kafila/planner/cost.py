"""The derived cost model (DESIGN §3): stage time, memory need and edge cost. Nothing here is fitted.

- stage time  t_i = o_i + Σ_{j∈S_i} s_j / b_i + [head]·U / u_i, where u_i is the member's measured
  unembedding bandwidth (b_i when it has none); kept as U_i = U·b_i/u_i "block-equivalent" bytes,
  so every formula stays o_i + bytes / b_i
- memory      Σ_{j∈S_i} (s_j + C·T·kv_j) + [head]·H ≤ M_i
- edge cost   r_A + r_B when relayed, |r_A − r_B| when predicted direct (a round-trip figure)

Every stage time the planner compares is computed by `stage_time`, so the search and any
brute-force check round identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from kafila.planner.reachability import DIRECT, predict_edge
from kafila.planner.spec import Member, ModelSpec, Workload


def stage_time(dispatch_s: float, bandwidth: float, nbytes: int, unembed: int = 0) -> float:
    """Seconds for one stage call that streams `nbytes` of blocks (plus `unembed` on the head)."""
    return dispatch_s + (nbytes + unembed) / bandwidth


def edge_cost_ns(a: Member, b: Member) -> int:
    """Predicted cost of the edge a–b in integer nanoseconds (integers so ring sums compare exactly)."""
    ra, rb = round(a.rtt_ms * 1e6), round(b.rtt_ms * 1e6)
    return abs(ra - rb) if predict_edge(a.nat, b.nat) == DIRECT else ra + rb


@dataclass(frozen=True)
class Ctx:
    """Prefix sums and per-member numbers for one (fleet, model, workload), members indexed by name order."""

    k: int
    S: tuple[int, ...]  # S[j] = bytes of blocks [0, j)
    W: tuple[int, ...]  # W[j] = bytes + C·T·kv of blocks [0, j)
    U: tuple[int, ...]  # U[i] = the unembedding as block-equivalent bytes for member i
    H: int
    o: tuple[float, ...]
    b: tuple[float, ...]
    M: tuple[int, ...]

    @property
    def m(self) -> int:
        """Number of members."""
        return len(self.o)

    def time(self, i: int, a: int, e: int, head: bool) -> float:
        """Stage time of member i holding blocks [a, e)."""
        return stage_time(self.o[i], self.b[i], self.S[e] - self.S[a], self.U[i] if head else 0)

    def need(self, a: int, e: int, head: bool) -> int:
        """Memory bytes for blocks [a, e) with their KV cache, plus the head's tensors."""
        return self.W[e] - self.W[a] + (self.H if head else 0)


def make_ctx(
    members: tuple[Member, ...],
    model: ModelSpec,
    workload: Workload,
    weight_scale: float = 1.0,
    memory_slack: int = 0,
) -> Ctx:
    """Build the context; `weight_scale` and `memory_slack` let admission ask "what if" questions."""
    blocks = [_scale(s, weight_scale) for s in model.blocks_bytes]
    tokens = workload.tokens
    return Ctx(
        k=model.k,
        S=(0, *accumulate(blocks)),
        W=(0, *accumulate(s + tokens * kv for s, kv in zip(blocks, model.kv_bytes_per_token, strict=True))),
        U=tuple(_unembed(_scale(model.unembed_bytes, weight_scale), mem) for mem in members),
        H=_scale(model.head_bytes, weight_scale),
        o=tuple(mem.dispatch_s for mem in members),
        b=tuple(mem.bandwidth for mem in members),
        M=tuple(mem.memory + memory_slack for mem in members),
    )


def _unembed(nbytes: int, mem: Member) -> int:
    """The unembedding's bytes as the blocks' bytes that take the same time on `mem`."""
    ub = mem.unembed_bandwidth
    return nbytes if ub is None else round(nbytes * mem.bandwidth / ub)


def _scale(nbytes: int, factor: float) -> int:
    return nbytes if factor == 1.0 else max(1 if nbytes else 0, round(nbytes * factor))

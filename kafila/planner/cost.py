"""The derived cost model (DESIGN §3, §2c): stage time, memory need and edge cost. Nothing here is fitted.

- stage time  t_i = o_i + |S_i|·p_i + Σ_{j∈S_i} r_j / b_i + [head]·(q_i + U / u_i), where p_i is the member's
  fixed time per block (DESIGN §2c: a block costs ~0.1 ms of thread barriers besides its bytes), r_j the
  bytes block j reads per call (`read_bytes`), u_i the member's unembedding bandwidth (b_i when it
  has none) and q_i its fixed unembedding time; kept as U_i = (q_i + U/u_i)·b_i "block-equivalent"
  bytes, so every formula stays o + n·p + bytes/b
- memory      Σ_{j∈S_i} (s_j + C·T·kv_j) + [head]·H ≤ M_i, sliding-window layers too (`kv_positions`)
- edge cost   r_A + r_B when relayed, |r_A − r_B| when predicted direct (a round-trip figure)

Every stage time the planner compares is computed by `stage_time`, so the search and any
brute-force check round identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from kafila.planner.reachability import DIRECT, predict_edge
from kafila.planner.spec import Member, ModelSpec, Workload


def stage_time(dispatch_s: float, block_s: float, bandwidth: float, n_blocks: int, nbytes: int,
               unembed: int = 0) -> float:
    """Seconds for one stage call of `n_blocks` blocks reading `nbytes` (plus `unembed` on the head)."""
    return dispatch_s + n_blocks * block_s + (nbytes + unembed) / bandwidth


def expected_experts(n: int, k: int, batch: int) -> float:
    """Expected distinct experts a batch of `batch` rows touches when each row routes to k of n experts.

    A row picks k distinct experts; over rows whose choices are independent and uniform, a given expert
    is missed by one row with probability 1 − k/n and by all of them with (1 − k/n)^B, so the expected
    number touched is E(B) = n·(1 − (1 − k/n)^B): k at B = 1, approaching n as B grows. For
    Qwen3-30B-A3B (n = 128, k = 8): 8 at B = 1, ~29.1 at B = 4. Real routers are not uniform, so
    this is an upper estimate of a skewed router's (popular experts repeat).
    """
    if n <= 0 or k <= 0:
        return 0.0
    return n * (1.0 - (1.0 - k / n) ** batch)


def read_bytes(model: ModelSpec, batch: int) -> tuple[int, ...]:
    """Bytes each block reads in one decode call of `batch` rows.

    Dense block: all of it. MoE block j (one routed expert x_j bytes, n experts, k used):
    r_j = s_j − n·x_j + round(E(B)·x_j) — dense tensors, router and shared experts, plus the expected
    distinct routed experts (`expected_experts`). The decode batch is the admitted concurrency C, so an
    MoE stage's time grows with C where a dense stage's barely does.

    Measured (CPU time of one thread, cuts timed alongside): a random Qwen3-30B-A3B-shaped block at batch 1
    with k patched to 8, 32 and 128 took the dense part plus k experts' bytes at the dense blocks' rate
    (within 10 %; k = 8 within 1.2 %): llama.cpp's mul_mat_id reads just the k chosen experts. Bytes are a memory-bound
    machine's cost; a compute-bound one also pays per row (the 8B-shaped dense block took 1.8× as long at
    batch 4 as at 1 on one core), which this leaves out for dense and MoE blocks alike.
    """
    return _with_experts(model, expected_experts(model.experts, model.experts_used, batch))


def prefill_bytes(model: ModelSpec, expert_scale: float = 1.0) -> tuple[int, ...]:
    """Bytes each block's weights count for in a prefill call of many rows, as the dense blocks' compute.

    A prefill row multiplies every dense tensor and only its k routed experts: a 128-row chunk reads nearly
    every expert once, but its compute is dense + k·x per row, not the whole block's (charging the whole
    block predicted Qwen3-30B-A3B's time to first token 5.4× too high). Routed experts compute slower per
    byte than dense matrices (kafila.engine.probe.EXPERT_SHAPES), so their bytes count `expert_scale` times:
    the member's dense prefill rate over its routed-expert rate for the model's expert type. Dense blocks:
    all their bytes.
    """
    return _with_experts(model, model.experts_used * expert_scale)


def _with_experts(model: ModelSpec, experts: float) -> tuple[int, ...]:
    """Each block's dense tensors plus `experts` routed experts' bytes (a dense block: all of it)."""
    if not any(model.expert_bytes):
        return model.blocks_bytes
    n = model.experts
    return tuple(s - n * x + round(experts * x) for s, x in zip(model.blocks_bytes, model.expert_bytes, strict=True))


def kv_positions(model: ModelSpec, workload: Workload) -> tuple[int, ...]:
    """KV cache positions each block reserves: C·T, sliding-window layers too.

    The stage engine keeps llama.cpp's default `swa_full`, under which a window layer's cache is as long as
    the whole context (tests/engine/test_window_cache.py): a window-sized one drops the oldest cells, which
    a slot trimmed back to a reused prefix would still need. Reserving only the window admitted rings that
    could not hold their caches (one gpt-oss window layer took 140 MB more at 65,536 cells than at 512).
    """
    return (workload.concurrency * workload.context,) * model.k


def edge_cost_ns(a: Member, b: Member) -> int:
    """Predicted cost of the edge a–b in integer nanoseconds (integers so ring sums compare exactly)."""
    ra, rb = round(a.rtt_ms * 1e6), round(b.rtt_ms * 1e6)
    return abs(ra - rb) if predict_edge(a.nat, b.nat) == DIRECT else ra + rb


@dataclass(frozen=True)
class Ctx:
    """Prefix sums and per-member numbers for one (fleet, model, workload), members indexed by name order."""

    k: int
    S: tuple[int, ...]  # S[j] = bytes blocks [0, j) read per call
    W: tuple[int, ...]  # W[j] = resident bytes + KV cache of blocks [0, j)
    U: tuple[int, ...]  # U[i] = the unembedding as block-equivalent bytes for member i
    H: int
    o: tuple[float, ...]
    p: tuple[float, ...]  # per-block fixed seconds
    b: tuple[float, ...]
    M: tuple[int, ...]
    # Cut rule: first_end[j] = the smallest end of a valid stage starting at j (k + 1: none);
    # last_start[e] = the largest start of a valid stage ending at e (−1: none). Without a rule j + 1, e − 1.
    first_end: tuple[int, ...]
    last_start: tuple[int, ...]
    # Q[i][e] = S[e] + e·p_i·b_i: member i's per-block time as bytes, so a time budget is a byte budget
    Q: tuple[tuple[float, ...], ...] = ()
    ruled: bool = False  # True when the model has a cut rule (first_end/last_start are not the trivial ones)

    @property
    def m(self) -> int:
        """Number of members."""
        return len(self.o)

    def time(self, i: int, a: int, e: int, head: bool) -> float:
        """Stage time of member i holding blocks [a, e)."""
        return stage_time(self.o[i], self.p[i], self.b[i], e - a, self.S[e] - self.S[a], self.U[i] if head else 0)

    def need(self, a: int, e: int, head: bool) -> int:
        """Memory bytes for blocks [a, e) with their KV cache, plus the head's tensors."""
        return self.W[e] - self.W[a] + (self.H if head else 0)

    def allowed(self, a: int, e: int) -> bool:
        """Whether [a, e) may be a stage under the model's cut rule."""
        return a < e and e >= self.first_end[a]


def make_ctx(
    members: tuple[Member, ...],
    model: ModelSpec,
    workload: Workload,
    weight_scale: float = 1.0,
    memory_slack: int = 0,
) -> Ctx:
    """Build the context; `weight_scale` and `memory_slack` let admission ask "what if" questions."""
    blocks = [_scale(s, weight_scale) for s in model.blocks_bytes]
    reads = [_scale(r, weight_scale) for r in read_bytes(model, workload.concurrency)]
    positions = kv_positions(model, workload)
    first_end, last_start = cut_rule(model)
    prefix = (0, *accumulate(reads))
    return Ctx(
        k=model.k,
        S=prefix,
        W=(0, *accumulate(s + t * kv for s, t, kv in zip(blocks, positions, model.kv_bytes_per_token, strict=True))),
        U=tuple(_unembed(_scale(model.unembed_bytes, weight_scale), mem) for mem in members),
        H=_scale(model.head_bytes, weight_scale),
        o=tuple(mem.dispatch_s for mem in members),
        p=tuple(mem.block_s for mem in members),
        b=tuple(mem.bandwidth for mem in members),
        M=tuple(mem.memory + memory_slack for mem in members),
        first_end=first_end,
        last_start=last_start,
        ruled=bool(model.must_hold),
        Q=tuple(tuple(S + e * mem.block_s * mem.bandwidth for e, S in enumerate(prefix)) for mem in members),
    )


def cut_rule(model: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(first_end, last_start) of `Ctx` for the model's `must_hold` flags (see Ctx)."""
    k = model.k
    if not model.must_hold:
        return tuple(range(1, k + 2)), tuple(range(-1, k))
    first_end = [k + 1] * (k + 1)
    nxt = k + 1
    for j in range(k - 1, -1, -1):
        if model.must_hold[j]:
            nxt = j + 1
        first_end[j] = nxt
    last_start = [-1] * (k + 1)
    prev = -1
    for e in range(1, k + 1):
        if model.must_hold[e - 1]:
            prev = e - 1
        last_start[e] = prev
    return tuple(first_end), tuple(last_start)


def unembed_seconds(nbytes: int, mem: Member) -> float:
    """Seconds of `mem`'s unembedding of `nbytes`: its fixed time plus the bytes at its own speed."""
    return mem.unembed_s + nbytes / (mem.unembed_bandwidth or mem.bandwidth)


def _unembed(nbytes: int, mem: Member) -> int:
    """The unembedding's bytes as the blocks' bytes that take the same time on `mem`."""
    if mem.unembed_bandwidth is None and not mem.unembed_s:
        return nbytes
    return round(unembed_seconds(nbytes, mem) * mem.bandwidth)


def _scale(nbytes: int, factor: float) -> int:
    return nbytes if factor == 1.0 else max(1 if nbytes else 0, round(nbytes * factor))

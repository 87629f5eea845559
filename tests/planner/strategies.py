"""Hypothesis strategies for small planner instances: unequal blocks, tight memory, every NAT mix."""

from __future__ import annotations

from hypothesis import strategies as st

from kafila.planner import Member, ModelSpec, NatClass, Workload


@st.composite
def instances(
    draw: st.DrawFn, max_members: int = 5, max_blocks: int = 12, min_members: int = 1, min_blocks: int = 1,
    extended: bool = False,
) -> tuple[tuple[Member, ...], ModelSpec, Workload]:
    """(members, model, workload) with m ≤ max_members, m ≤ k ≤ max_blocks; memory often just tight.

    `extended`: members may have a per-block time, and the model MoE blocks, sliding-window layers and a
    cut rule (every stage holds a flagged block, with at least m flags so some partition exists)."""
    m = draw(st.integers(min_members, max_members))
    k = draw(st.integers(max(m, min_blocks), max_blocks))
    blocks = list(draw(st.lists(st.integers(1, 40), min_size=k, max_size=k)))
    kv = tuple(draw(st.lists(st.integers(0, 3), min_size=k, max_size=k)))
    moe: dict[str, object] = {}
    if extended and draw(st.booleans()):
        n = draw(st.integers(2, 8))
        used = draw(st.integers(1, n))
        experts = tuple(draw(st.lists(st.integers(0, 5), min_size=k, max_size=k)))
        blocks = [s + n * x for s, x in zip(blocks, experts, strict=True)]
        moe = {"expert_bytes": experts, "experts": n, "experts_used": used}
    if extended and draw(st.booleans()):
        moe["kv_window"] = tuple(draw(st.lists(st.sampled_from([0, 0, 1, 2, 3]), min_size=k, max_size=k)))
    if extended and draw(st.booleans()):
        flags = draw(st.lists(st.booleans(), min_size=k, max_size=k))
        unflagged = [j for j in range(k) if not flags[j]]
        for j in draw(st.permutations(unflagged))[:max(0, m - sum(flags))]:
            flags[j] = True
        moe["must_hold"] = tuple(flags)
    model = ModelSpec(
        name="t",
        blocks_bytes=tuple(blocks),
        kv_bytes_per_token=kv,
        unembed_bytes=draw(st.integers(0, 60)),
        head_bytes=draw(st.integers(0, 80)),
        **moe,  # type: ignore[arg-type]
    )
    workload = Workload(concurrency=draw(st.integers(1, 3)), context=draw(st.integers(1, 4)))
    need = sum(blocks) + workload.tokens * sum(kv) + model.head_bytes
    # Memory around an even share of the need: some fleets fit with room, many only just, some not at all.
    share = max(1, need // m)
    members = tuple(
        Member(
            name=f"n{i}",
            bandwidth=draw(st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0])) * draw(st.sampled_from([1.0, 1.5])),
            dispatch_s=draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])),
            memory=max(1, int(share * draw(st.sampled_from([0.5, 0.9, 1.0, 1.2, 1.6, 3.0])))),
            rtt_ms=draw(st.sampled_from([0.0, 5.0, 10.0, 12.5, 30.0])),
            nat=draw(st.sampled_from(list(NatClass))),
            unembed_bandwidth=draw(st.sampled_from([None, 1.0, 4.0, 16.0])),
            block_s=draw(st.sampled_from([0.0, 0.25, 1.0, 3.0])) if extended else 0.0,
        )
        for i in range(m)
    )
    return members, model, workload

"""Hypothesis strategies for small planner instances: unequal blocks, tight memory, every NAT mix."""

from __future__ import annotations

from hypothesis import strategies as st

from kafila.planner import Member, ModelSpec, NatClass, Workload


@st.composite
def instances(
    draw: st.DrawFn, max_members: int = 5, max_blocks: int = 12, min_members: int = 1, min_blocks: int = 1
) -> tuple[tuple[Member, ...], ModelSpec, Workload]:
    """(members, model, workload) with m ≤ max_members, m ≤ k ≤ max_blocks; memory often just tight."""
    m = draw(st.integers(min_members, max_members))
    k = draw(st.integers(max(m, min_blocks), max_blocks))
    blocks = tuple(draw(st.lists(st.integers(1, 40), min_size=k, max_size=k)))
    kv = tuple(draw(st.lists(st.integers(0, 3), min_size=k, max_size=k)))
    model = ModelSpec(
        name="t",
        blocks_bytes=blocks,
        kv_bytes_per_token=kv,
        unembed_bytes=draw(st.integers(0, 60)),
        head_bytes=draw(st.integers(0, 80)),
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
        )
        for i in range(m)
    )
    return members, model, workload

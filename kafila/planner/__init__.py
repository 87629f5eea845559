"""The planner: pure functions from measured numbers to a ring plan. No I/O, no net, no engine, no model
(but `files`, which reads fleet and model files for the CLI and the benchmarks).

Use::

    from kafila.planner import Member, ModelSpec, Workload, make_plan
    plan = make_plan(members, model, Workload(concurrency=4, context=4096))
    if plan.feasible:
        plan.order    # member names in ring order, head first: tokens flow order[0] → order[1] → … → order[0]
        plan.head     # == plan.order[0]: embedding, the LAST block range, unembedding, sampler
        plan.ranges   # {name: (start, end)} half-open; order[1] gets [0, …), the head gets [a, k)
    else:
        plan.admission.text   # who is short of memory, and what would admit the session
    plan.to_json()            # the stable schema (issue 3), baselines included

Inputs are SI: `Member(name, bandwidth [bytes/s], dispatch_s, memory [bytes], rtt_ms, nat, …, block_s)`,
`ModelSpec(name, blocks_bytes, kv_bytes_per_token, unembed_bytes, head_bytes, …)` with optional MoE
(`expert_bytes`, `experts`, `experts_used`), sliding-window (`kv_window`) and cut-rule (`must_hold`,
`whole_only`) fields; the cost model is in `cost`. Bad numbers
raise `kafila.errors.PlanInputError` naming the field. `kafila.planner.schema` turns fleet and
model JSON objects into these; `kafila.planner.files` reads them from files (a model from GGUF too).

Modules: spec (inputs), cost (the cost model), reachability (NAT pairs, counting rule),
order (ring order search), partition (exact bisection + feasibility pass, head rotation),
baselines (uniform, memory-proportional), admission (rejection reasons), placement (one
split and its JSON), plan (make_plan).
"""

from kafila.planner.plan import STRATEGIES, Plan, make_plan
from kafila.planner.reachability import NatClass, all_direct_ring_exists, predict_edge
from kafila.planner.spec import Member, ModelSpec, Workload

__all__ = [
    "STRATEGIES",
    "Member",
    "ModelSpec",
    "NatClass",
    "Plan",
    "Workload",
    "all_direct_ring_exists",
    "make_plan",
    "predict_edge",
]

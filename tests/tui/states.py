"""Session states for the dashboard's tests and screenshots, built from the real planner's output.

The members are the bench LAN fleet (bench/fleet-lan.json) serving Qwen3-8B Q4_K_M; the plan,
its baselines and the rejection text come from `kafila.planner.make_plan`, so the screens render
exactly the JSON the session puts in `SessionState.plan`. One edge is verified against its
prediction (predicted direct, found relayed) so the "wrong prediction" marking has something to show.

Run ``python -m tests.tui.states DIR`` to write them as JSON (for ``kafila tui --replay``).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path

from kafila.planner import Member, Workload, make_plan, predict_edge
from kafila.planner.files import load_fleet, load_model
from kafila.planner.reachability import NatClass
from kafila.session.state import EdgeView, MemberView, SessionState, StageStats

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "bench" / "fleet-lan.json"
MODEL = REPO / "bench" / "qwen3-8b-q4_k_m.json"
T0 = 1_764_500_000.0  # fixed event times keep screenshots identical between runs

EVIDENCE = {
    "permissive": {"mapped": "203.0.113.7:50112", "heard_change_ip_port": True, "heard_change_port": True},
    "restrictive": {"mapped": "100.64.12.9:61002", "mapped_alt_port": "100.64.12.9:61019",
                    "mapped_alt_ip": "100.64.12.9:61020", "heard_change_ip_port": False, "heard_change_port": False},
    "ordinary": {"mapped": "198.51.100.4:41830", "mapped_alt_port": "198.51.100.4:41830",
                 "mapped_alt_ip": "198.51.100.4:41830", "heard_change_ip_port": False, "heard_change_port": False},
}


def fleet() -> tuple[Member, ...]:
    """The LAN fleet, with the laptop on a phone hotspot (restrictive NAT) so the ring needs one relay."""
    return tuple(replace(m, nat=NatClass.RESTRICTIVE) if m.name == "rtx3060-laptop" else m
                 for m in load_fleet(str(FLEET)))


def _probe_samples(bandwidth: float, seed: int, n: int = 24) -> list[float]:
    rnd = random.Random(seed)
    # Warm-up calls are slower, then the rate settles around the measured value.
    return [bandwidth * min(1.0, 0.55 + 0.08 * i) * rnd.uniform(0.93, 1.04) for i in range(n)]


def members_state(phase: str = "measuring", count: int | None = None) -> SessionState:
    """A host's view while members join and measure themselves (`count` of the five so far)."""
    fleet_ = fleet()
    notes = {m["name"]: m.get("note", "") for m in json.loads(FLEET.read_text())["members"]}
    st = SessionState(role="host", me="host", code="kf-7421-amber-otter", phase="waiting",
                      model="Qwen3-8B Q4_K_M")
    for i, m in enumerate(fleet_[:count]):
        emulated = {"throttle": 4.0, "memory_gb": 24.0} if m.name == "old-i7-desktop" else {}
        st.members[m.name] = MemberView(
            name=m.name, status="ready", bandwidth_bytes_per_s=m.bandwidth, dispatch_s=m.dispatch_s,
            memory_bytes=int(m.memory), rtt_ms=m.rtt_ms, nat=m.nat.value,
            nat_evidence=dict(EVIDENCE.get(m.nat.value, {}), rtt_ms=m.rtt_ms), emulated=emulated,
            probe_samples=_probe_samples(m.bandwidth, i), build="llama.cpp b0c1e570 cpu avx2",
            note=notes[m.name])
        st.events.append((T0 + i, f"{m.name} joined ({m.nat.value} NAT, {m.bandwidth / 1e9:.0f} GB/s)"))
    st.phase = phase
    return st


def planned_state(phase: str, workload: Workload) -> SessionState:
    """All five members measured, and the real planner's plan (or rejection) for `workload` on them."""
    st = members_state(phase)
    st.plan = make_plan(fleet(), load_model(str(MODEL)), workload).to_json("kafila")
    return st


def admitted_state() -> SessionState:
    """An admitted session: plan, predictions, verified edges (one wrong), stage timings, chat API."""
    st = planned_state("admitted", Workload(concurrency=1, context=4096))
    fleet_ = fleet()
    names = [m.name for m in fleet_]
    classes = {m.name: NatClass(m.nat) for m in fleet_}
    st.predicted = {a: {b: predict_edge(classes[a], classes[b]) for b in names if b != a} for a in names}
    # Verification: relays predicted are relayed; one direct guess between two ordinary NATs fails
    # (its punch timed out, so it fell back to the relay): the wrong prediction the screen must show.
    wrong = next(e for e in st.plan["edges"] if e["predicted"] == "direct"
                 and classes[e["a"]] == classes[e["b"]] == NatClass.ORDINARY)
    for e in st.plan["edges"]:
        got = "relayed" if e["predicted"] == "relay" or e is wrong else "direct"
        st.edges.append(EdgeView(e["a"], e["b"], e["predicted"], got, 38.0 if got == "direct" else 412.0))
    slow = max(st.plan["stage_seconds"], key=st.plan["stage_seconds"].__getitem__)
    for name, t in st.plan["stage_seconds"].items():
        st.stages[name] = StageStats(predicted_s=t, measured_s=t * (1.07 if name == slow else 0.97), calls=412)
    st.delivery = {n: (int(b), int(b)) for n, b in st.plan["memory_bytes"].items()}
    st.tokens_per_s, st.network_share = 31.2, 0.14
    st.api_url = "http://127.0.0.1:8711"
    st.events += [(T0 + 10, f"plan: head {st.plan['head']}, bottleneck "
                            f"{st.plan['bottleneck_seconds'] * 1000:.2f} ms ({slow})"),
                  (T0 + 12, "stages delivered"),
                  (T0 + 14, f"edge {wrong['a']} → {wrong['b']} relayed (predicted direct; punch timed out)"),
                  (T0 + 15, "admitted: 1 × 4096 tokens")]
    for m in st.members.values():
        m.status = "serving"
    return st


def measuring_state() -> SessionState:
    """Four members measured, the fifth still probing its bandwidth and NAT."""
    st = members_state("measuring")
    late = st.members["rtx3060-laptop"]
    late.status, late.nat, late.nat_evidence = "measuring", None, {}
    late.bandwidth_bytes_per_s, late.dispatch_s = None, None
    late.probe_samples = late.probe_samples[:7]
    return st


def delivering_state() -> SessionState:
    """Planned; stages on their way to the members; the ring's edges not verified yet."""
    st = admitted_state()
    st.phase, st.api_url, st.tokens_per_s, st.network_share = "delivering", None, None, None
    st.stages = {}
    for e in st.edges:
        e.state, e.ready_ms = "pending", None
    st.edges[0].state, st.edges[0].ready_ms = "direct", 41.0
    for i, (name, (_, total)) in enumerate(st.delivery.items()):
        st.delivery[name] = (total * (i + 1) // 6, total)
    for m in st.members.values():
        m.status = "loading"
    del st.events[-3:]
    return st


def rejected_state() -> SessionState:
    """64 requests of 32768 tokens: the fleet cannot hold the KV cache, and the reasons say what would fit."""
    st = planned_state("rejected", Workload(concurrency=64, context=32768))
    st.rejection = st.plan["reason"]
    st.events.append((T0 + 10, "rejected: does not fit in memory"))
    return st


def lost_state() -> SessionState:
    """An admitted session that then lost a member."""
    st = admitted_state()
    st.phase = "lost"
    who = "rtx4070-desktop"
    a, b = st.plan["ranges"][who]  # type: ignore[index]
    st.lost = f"{who} stopped answering (no frames for 5.0 s); the ring cannot go on without blocks [{a}, {b})"
    st.members[who].status = "lost"
    st.events.append((T0 + 60, f"lost {who}"))
    return st


ALL = {"members": members_state, "measuring": measuring_state, "delivering": delivering_state,
       "admitted": admitted_state, "rejected": rejected_state, "lost": lost_state}


def main(argv: list[str]) -> int:
    """Write each state as DIR/<name>.json."""
    out = Path(argv[0] if argv else ".")
    out.mkdir(parents=True, exist_ok=True)
    for name, make in ALL.items():
        (out / f"{name}.json").write_text(json.dumps(make().to_json(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The planner as the coordinator sees it: members' verified announcements in, placements out. Pure.

Whom the next plan takes (a member that came late is held until taking it in cuts the slowest stage by GAIN),
and what a plan's slowest stage would be at given speeds (a drift is planned for only when that cuts it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from kafila.errors import SessionError
from kafila.model.describe import ModelInfo
from kafila.model.gguf_file import GGUFFile
from kafila.model.gguf_set import SHARD_NAME
from kafila.net.trust import VerifiedMember
from kafila.planner import Member, ModelSpec, Plan, Workload, make_plan
from kafila.planner.placement import Placement
from kafila.session.settings import SessionSettings
from kafila.session.state import expert_rates

EXIT_REJECTED = 3
GAIN = 0.1  # a drifting member is planned around, a newcomer planned in, when that cuts the slowest stage this much


def cuts_enough(now: float | None, new: float | None) -> bool:
    """Whether a new plan's slowest stage `new` is GAIN or more below `now` (None: no feasible plan)."""
    return now is not None and new is not None and new <= (1 - GAIN) * now


def model_label(model: Path) -> str:
    """The name a user sees for a model: its file's stem (a GGUF's general.name is often a raw slug), without a
    split set's `-00001-of-0000N`; an Ollama blob is named by its digest, so there general.name it is."""
    m = SHARD_NAME.match(model.name)
    if m:
        return m.group("prefix")
    if model.name.startswith("sha256-") and not model.suffix:
        return str(GGUFFile(model).get("general.name", model.name))
    return model.stem


def planner_member(vm: VerifiedMember, slower: float = 1.0) -> Member:
    """The planner's view of a member's verified announcement; `slower`: its calls take that many times
    what its probe measured (seen while serving, drift.py): every time scaled up, every rate down."""
    m = vm.measurements
    try:
        emu = m.get("emu") or {}
        member = Member(vm.name, float(m["bw"]) / slower, float(m["disp"]) * slower, int(m["mem"]),
                        float(vm.rtt_ms or 0.0), vm.nat_class, float(m["ubw"]) / slower,
                        unembed_s=float(m.get("uo", 0.0)) * slower, block_s=float(m.get("blk", 0.0)) * slower,
                        # prefill and the machine: absent from an older member's announcement (no TTFT then)
                        prefill_bandwidth=float(m.get("pbw", 0.0)) / slower,
                        prefill_dispatch_s=float(m.get("pdisp", 0.0)) * slower,
                        prefill_block_s=float(m.get("pblk", 0.0)) * slower, prefill_rows=int(m.get("prow", 0)),
                        prefill_attn_s=float(m.get("patt", 0.0)) * slower,
                        prefill_expert_rates=tuple((kind, rate / slower)
                                                   for kind, rate in sorted(expert_rates(m).items())),
                        # the time it lost is not compute: a throttle, for the planner's machines shared by stages
                        machine=str(m.get("mach", "")), throttle=max(float(emu.get("throttle", 1.0)) * slower, 1.0))
    except (KeyError, TypeError, ValueError):
        raise SessionError(f"member {vm.name} announced no usable measurements") from None
    # JSON carries NaN and infinities: one in a plan's sums makes every comparison false
    bad = [f.name for f in fields(member) if isinstance(v := getattr(member, f.name), int | float)
           and not isinstance(v, bool) and not (math.isfinite(v) and v >= 0)]
    bad += [name for name in ("bandwidth", "unembed_bandwidth", "memory") if not bad and not getattr(member, name)]
    if bad:
        raise SessionError(f"member {vm.name} announced unusable measurements ({', '.join(bad)})")
    return member


def unusable_measurements(peer: VerifiedMember) -> str | None:
    """Why a member's announced measurements cannot be planned with (missing, NaN, negative), or None."""
    try:
        planner_member(peer)
    except SessionError as exc:
        return str(exc)
    return None


@dataclass
class Planner:
    """Plans over admitted members (name → verified announcement) at their measured speeds."""

    info: ModelInfo
    settings: SessionSettings
    make: Callable[[list[Member], ModelSpec, Workload], Plan] = make_plan
    _memo: dict[tuple[Member, ...], Plan] = field(default_factory=dict)  # the last few plans: asked for again

    def plan(self, peers: list[VerifiedMember], speed: dict[str, float]) -> tuple[Plan, Placement]:
        """The plan over `peers`, each at its `speed` (its stage time over its probe's; 1.0 when absent)."""
        members = tuple(planner_member(p, speed.get(p.name, 1.0)) for p in peers)
        plan = self._memo.get(members)
        if plan is None:
            s = self.settings
            plan = self.make(list(members), ModelSpec.described(self.info), Workload(s.concurrency, s.context, s.batch))
            self._memo = {**dict(list(self._memo.items())[-15:]), members: plan}
        return plan, plan.placement(self.settings.strategy)

    def slowest(self, peers: list[VerifiedMember], speed: dict[str, float]) -> float | None:
        """The slowest stage of the plan over `peers` at `speed`; None: no feasible plan."""
        placement = self.plan(peers, speed)[1]
        return placement.bottleneck_seconds if placement.feasible else None

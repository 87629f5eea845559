"""A member takes coordination over when a serving host is lost (issue 14 (b)).

The host's own stage goes with it, so the ring must be re-planned over the survivors, and only a
process that holds the model's bytes can cut new stages. Every member knows the same replicated
`roster` (who serves, what each measured, which of them hold the model, verified by sha256 at
admission) and the same assignment, so each makes the same choice without a word exchanged: the
first member in ring order, other than the one lost with the coordinator, that holds the model.

That member runs the host's own coordinator (`HostRuntime`: plan, cut, deliver, admit) on a second
endpoint in its process, announced as the session's coordinator; every survivor, the successor's
own member included, connects to it as it connected to the host, and the session goes on as after
any member loss (the API servers resume replies that were in flight).
"""

from __future__ import annotations

from collections.abc import Sequence

from kafila.model.describe import describe_model
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.session.cache_inventory import InUse
from kafila.session.host import HostRuntime, coordinator_announcement, relay_events
from kafila.session.messages import Assign, Roster
from kafila.session.options import HostOptions, MemberOptions
from kafila.session.state import SessionState

TAKEOVER_WAIT_S = 60.0  # how long the new coordinator waits for the survivors before planning with those it has
FIND_COORDINATOR_S = 60.0  # how long a survivor looks for the new coordinator's announcement


def successor(roster: Roster, order: Sequence[str]) -> str | None:
    """Who coordinates after the coordinator is lost with its own ring member; None: no survivor holds the model."""
    return next((n for n in order if n != roster.beside and n in roster.holders), None)


def survivors(roster: Roster, order: Sequence[str]) -> list[str]:
    """The ring members left once the coordinator's process (and its ring member) is gone."""
    return [n for n in order if n != roster.beside]


def coordinator_options(opts: MemberOptions, assign: Assign, roster: Roster, expected: int) -> HostOptions:
    """The host's settings, as replicated to every member, for the member that coordinates now.

    It only coordinates from its second endpoint: its ring member is the member already running.
    """
    assert opts.model is not None
    c = assign.config
    return HostOptions(model=opts.model, rendezvous=opts.rendezvous, members=expected, coordinate_only=True,
                       name=opts.name, threads=opts.threads, wait_s=TAKEOVER_WAIT_S, concurrency=c["n_seq_max"],
                       context=c["n_ctx_per_seq"], batch=c["n_batch"], api_port=None, bind=opts.bind,
                       cache_dir=opts.cache_dir, link_idle_timeout_s=opts.link_idle_timeout_s,
                       allow_direct=opts.allow_direct, mixed_builds=roster.mixed_builds, strategy=roster.strategy)


async def coordinate(opts: MemberOptions, assign: Assign, roster: Roster, member_state: SessionState,
                     cache: StageCache, use: InUse | None) -> int:
    """Run the session's coordination from this member's process until the session ends; returns its status."""
    host_opts = coordinator_options(opts, assign, roster, len(survivors(roster, assign.order)))
    assert host_opts.model is not None
    state = SessionState()
    state.role, state.me, state.coordinator, state.model = "host", opts.name, opts.name, roster.model
    relay_events(state, member_state, "coordinating: ")
    info = describe_model(host_opts.model)
    async with PeerEndpoint(bind=opts.bind, name=opts.name, idle_timeout_s=opts.link_idle_timeout_s,
                            allow_direct=opts.allow_direct) as ep:
        await ep.probe_nat(opts.rendezvous)
        await ep.join_session(opts.rendezvous, opts.code)
        await ep.announce(coordinator_announcement())
        state.set_phase("waiting", f"waiting for {', '.join(survivors(roster, assign.order))}")
        runtime = HostRuntime(ep, host_opts, state, host_opts.model, info, cache, None, use, beside=opts.name)
        return await runtime.run()

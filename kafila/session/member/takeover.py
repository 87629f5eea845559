"""A member takes coordination over when the host is lost (issue 14 (b), and (a) followed by a later loss).

The host's own stage goes with it, so the ring must be re-planned over the survivors, and only a
process that holds the model's bytes can cut new stages. Every member knows the same replicated
`roster` (who serves, what each measured, which of them hold the model: verified by sha256 at
admission, or given a whole copy by the host since, delivery.model_copy_sender) and the same assignment,
so each makes the same choice without a word exchanged: the first member in ring order, other than
the one lost with the coordinator, that holds the model.

That member runs the host's own coordinator (`HostRuntime`: plan, cut, deliver, admit) on a second
endpoint in its process, announced as the session's coordinator; every survivor, the successor's
own member included, connects to it as it connected to the host, and the session goes on as after
any member loss (the API servers resume replies that were in flight).

A coordinate-only host held no stage, so its loss leaves the ring serving. The same choice names
the member that coordinates from then on, and it starts at once (`adopt`): its coordinator takes the
serving ring over as it is (no re-plan, no stage moved), so that `/kafila/state` names a coordinator
that is really there, and a later member loss reaches it as the host's own `lost` reports do. Waiting
for the later loss instead would need every member to agree on who was lost, which only the lost
member's two neighbours see: without a coordinator the others would never hear of it.

The choice is the member's machine's (machine.Follower.without_coordinator); following the successor, or
coordinating from this process, is its shell's (runtime.MemberRuntime._follow); this module holds the rule
and the coordinator a successor runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from pathlib import Path

from kafila.errors import ProtocolError
from kafila.model.describe import describe_model
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.mandate import Credential
from kafila.net.quic import Identity
from kafila.session.coordinator.runtime import HostRuntime, coordinator_announcement, relay_events
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.options import HostOptions, MemberOptions
from kafila.session.protocol.messages import Assign, Roster
from kafila.session.state import SessionState

TAKEOVER_WAIT_S = 60.0  # how long the new coordinator waits for the survivors before planning with those it has
FIND_COORDINATOR_S = 60.0  # how long a survivor looks for the new coordinator's announcement
END_GRACE_S = 1.0  # a session that cannot go on: how long clients get to read why before this process ends


def successor(roster: Roster, order: Sequence[str], lost: Collection[str] = ()) -> str | None:
    """Who coordinates after the coordinator is lost: the first survivor in ring order holding the model.

    The coordinator's own ring member (`roster.beside`) is gone with it, and so are the `lost`.
    None: no survivor holds the model, so nobody can cut stages for a new plan.
    """
    return next((n for n in survivors(roster, order, lost) if n in roster.holders), None)


def survivors(roster: Roster, order: Sequence[str], lost: Collection[str] = ()) -> list[str]:
    """The ring members left once the coordinator's process (and its ring member) and the `lost` are gone."""
    return [n for n in order if n != roster.beside and n not in lost]


def mandated(roster: Roster, me: str) -> Credential | None:
    """The credential the last coordinator signed for this member to announce as its successor (kafila.net.mandate);
    None when it signed none (survivors still follow by the roster's fingerprint; members joining later cannot
    find this coordinator then)."""
    try:
        return Credential.from_json(roster.mandates[me]) if me in roster.mandates else None
    except ProtocolError:
        return None


def coordinator_options(opts: MemberOptions, model: Path, assign: Assign, roster: Roster,
                        expected: int) -> HostOptions:
    """The options of the member that coordinates now (with `model`: its own file, or the copy the host gave it).

    The session's settings are the last assignment's, unchanged (kafila.session.settings); the rest is how this
    process runs. It only coordinates from its second endpoint: its ring member is the member already running.
    """
    return HostOptions(model=model, rendezvous=opts.rendezvous, members=expected, coordinate_only=True,
                       name=opts.name, threads=opts.threads, wait_s=TAKEOVER_WAIT_S, settings=assign.settings,
                       api_port=None, bind=opts.bind, cache_dir=opts.cache_dir,
                       link_idle_timeout_s=opts.link_idle_timeout_s, allow_direct=opts.allow_direct,
                       label=roster.model)


async def coordinate(opts: MemberOptions, model: Path, assign: Assign, roster: Roster, member_state: SessionState,
                     cache: StageCache, use: InUse | None, adopt: bool = False,
                     identity: Identity | None = None) -> int:
    """Run the session's coordination from this member's process until the session ends; returns its status.

    `adopt`: the ring of `assign` still serves (its coordinator held no stage): take it over as it is.
    `identity`: the member's own certificate, which the survivors know from the roster and pin.
    """
    ring = list(assign.order) if adopt else survivors(roster, assign.order)
    host_opts = coordinator_options(opts, model, assign, roster, len(ring))
    state = SessionState()
    state.role, state.me, state.coordinator, state.model = "host", opts.name, opts.name, roster.model
    relay_events(state, member_state, "coordinating: ")
    info = await asyncio.to_thread(describe_model, model)  # off the loop: the member's links are read on it
    async with PeerEndpoint(bind=opts.bind, identity=identity, name=opts.name,
                            idle_timeout_s=opts.link_idle_timeout_s, allow_direct=opts.allow_direct,
                            link_delay_s=opts.link_delay_ms / 1e3, link_rate=opts.link_rate) as ep:
        await ep.probe_nat(opts.rendezvous)
        await ep.join_session(opts.rendezvous, opts.code)
        credential = mandated(roster, opts.name)
        await ep.announce(coordinator_announcement(credential))
        state.set_phase("waiting", f"waiting for {', '.join(ring)}")
        runtime = HostRuntime(ep, host_opts, state, model, info, cache, None, use, beside=opts.name,
                              serving=assign if adopt else None, departed=frozenset(set(roster.members) - set(ring)),
                              credential=credential)
        return await runtime.run()

"""`kafila host`: the coordinator, and this machine as an ordinary member of its own ring beside it.

The member runs in the same process (its own endpoint, measured, planned and given a stage like any other),
unless `coordinate_only`. After a member is lost the coordinator plans again over the others when the
model still fits (a new epoch), so new requests are served by the smaller ring.
"""

from __future__ import annotations

from kafila.errors import KafilaError
from kafila.session.coordinator.runtime import relay_events
from kafila.session.coordinator.session import coordinate_session
from kafila.session.member.join import run_member
from kafila.session.options import HostOptions, MemberOptions
from kafila.session.state import SessionState


async def run_host(opts: HostOptions, state: SessionState) -> int:
    """Open a session and run it until it ends; returns an exit status (3: rejected)."""

    async def own_member(code: str) -> None:
        await _own_member(opts, code, state)

    if opts.link_rate is not None and opts.coordinate_only:  # else its own member says it
        state.log(f"this machine's connection: {opts.link_rate.label()}")
    return await coordinate_session(opts, state, own_member)


async def _own_member(opts: HostOptions, code: str, host_state: SessionState) -> None:
    """This machine as an ordinary member of its own session (its events go to the host's log).

    Its end is not the session's: the host sees it as a lost member, like any other.
    """
    mine = SessionState()
    relay_events(mine, host_state, f"{opts.name} (this machine): ")
    member_opts = MemberOptions(code=code, rendezvous=opts.rendezvous, name=opts.name, api_port=None,
                                cache_dir=opts.cache_dir, link_idle_timeout_s=opts.link_idle_timeout_s,
                                allow_direct=opts.allow_direct, threads=opts.threads, draft=opts.draft,
                                link_rate=opts.link_rate)  # one machine: its member shares the host's connection
    try:
        await run_member(member_opts, mine)
    except KafilaError as exc:
        host_state.log(f"{opts.name} (this machine) left the ring: {exc}")

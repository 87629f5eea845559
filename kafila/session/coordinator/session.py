"""The host's session: open it at the rendezvous (its join code), serve the chat API, and coordinate it.

The host's machine serves too, unless `coordinate_only`: its ordinary member runs beside the coordinator
in the same process. That member is the caller's to give (kafila.session.launch.host composes the two),
so that the coordinator never imports the member it coordinates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from kafila.model.describe import ModelInfo, describe_model
from kafila.model.embedded import resolve_model
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import Addr, PeerEndpoint
from kafila.net.mandate import Credential, bound_secret
from kafila.net.trust import JoinCode
from kafila.session.api.server import ApiServer
from kafila.session.coordinator.planning import model_label
from kafila.session.coordinator.runtime import HostRuntime, coordinator_announcement
from kafila.session.delivery.cache_inventory import InUse, start_cache_use
from kafila.session.options import HostOptions
from kafila.session.state import SessionState

OWN_MEMBER_STOP_S = 5.0  # how long the host's own member may take to close after the host's goodbye
OwnMember = Callable[[str], Coroutine[Any, Any, None]]  # runs this machine's member, given the join code


async def coordinate_session(opts: HostOptions, state: SessionState, own_member: OwnMember | None) -> int:
    """Open a session and run it until it ends; returns an exit status (3: rejected).

    `own_member` is started once the join code exists, unless `opts.coordinate_only`; it ends with the session.
    """
    state.role, state.me = "host", "host"
    state.coordinator = "host"
    model = resolve_model(opts.model)
    info = describe_model(model)
    state.model = model_label(model)
    cache = StageCache(opts.cache_dir)
    with start_cache_use(cache.root) as use:
        return await _serve_host(opts, state, model, info, cache, use, own_member)


async def open_session(ep: PeerEndpoint, rendezvous: Addr) -> tuple[JoinCode, Credential]:
    """Create a session whose join code is made from `ep`'s certificate (kafila.net.mandate), and announce `ep`
    as its coordinator with the credential that proves it."""
    credential = Credential.new_host()
    code = await ep.create_session(rendezvous, bound_secret(ep.identity.fingerprint, credential.salt))
    await ep.announce(coordinator_announcement(credential))
    return code, credential


async def _serve_host(opts: HostOptions, state: SessionState, model: Path, info: ModelInfo, cache: StageCache,
                      use: InUse, own_member: OwnMember | None) -> int:
    async with PeerEndpoint(bind=opts.bind, name="host", idle_timeout_s=opts.link_idle_timeout_s,
                            allow_direct=opts.allow_direct, on_rendezvous=state.set_rendezvous,
                            link_rate=opts.link_rate) as ep:
        await ep.probe_nat(opts.rendezvous)
        code, credential = await open_session(ep, opts.rendezvous)
        state.code = str(code)
        state.set_phase("waiting", f"session open; join code {code}")
        api = None
        if opts.api_port is not None:
            api = await ApiServer(state, port=opts.api_port).start_or_none()
        # not in a TaskGroup: the host's own errors must reach the CLI as they are, not wrapped in a group
        own = None if opts.coordinate_only or own_member is None else asyncio.create_task(own_member(str(code)))
        try:
            beside = None if opts.coordinate_only else opts.name
            return await HostRuntime(ep, opts, state, model, info, cache, api, use, beside,
                                     credential=credential).run()
        finally:
            if own is not None:  # it has had the host's goodbye; it ends with the host in any case
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(own), OWN_MEMBER_STOP_S)
                own.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await own
            if api is not None:
                await api.stop()

"""`kafila join`: announce this machine at the rendezvous, connect to the host, measure the machine, and serve.

After the connection the member follows its coordinator (runtime.MemberRuntime) until the session ends.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from kafila.engine.probe_cache import cached_probe
from kafila.model.embedded import default_model_path, resolve_model
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.session.api.server import ApiServer
from kafila.session.delivery.cache_inventory import InUse, start_cache_use
from kafila.session.delivery.local_model import model_claim
from kafila.session.member.host_link import connect_host
from kafila.session.member.measuring import measure_connected
from kafila.session.member.runtime import MemberRuntime
from kafila.session.options import MemberOptions
from kafila.session.protocol import messages
from kafila.session.protocol.announcement import Emulation, identity, measurements
from kafila.session.state import SessionState, member_view
from kafila.session.stoppable import run_stoppable


async def run_member(opts: MemberOptions, state: SessionState) -> int:
    """Join a session with a code and serve in it until the host ends it; returns an exit status."""
    state.role, state.me, state.code = "member", opts.name, opts.code
    cache = StageCache(opts.cache_dir)
    if opts.model is not None:
        opts = replace(opts, model=resolve_model(opts.model))  # a name or path, checked before anything else
    with start_cache_use(cache.root) as use:
        return await _serve_member(opts, state, cache, use)


async def _serve_member(opts: MemberOptions, state: SessionState, cache: StageCache, use: InUse) -> int:
    rate = opts.link_rate
    emulation = Emulation(opts.throttle, opts.memory_gb, opts.link_delay_ms, rate.up_mbit if rate else 0.0,
                          rate.down_mbit if rate else 0.0)
    claim: dict[str, str] = {}
    if opts.model is not None:
        state.set_phase("measuring", f"hashing {opts.model} (once per file: the hash is cached)")
        claim = await run_stoppable(partial(model_claim, cache, opts.model))  # minutes for a big model
        state.log(f"holding the model {opts.model.name} (sha256 {claim['model_sha256']})")
    async with PeerEndpoint(bind=opts.bind, name=opts.name, idle_timeout_s=opts.link_idle_timeout_s,
                            allow_direct=opts.allow_direct, on_rendezvous=state.set_rendezvous,
                            link_delay_s=opts.link_delay_ms / 1e3, link_rate=opts.link_rate) as ep:
        if opts.link_rate is not None:
            state.log(f"this machine's connection: {opts.link_rate.label()}")
        report = await ep.probe_nat(opts.rendezvous)
        await ep.join_session(opts.rendezvous, opts.code)
        # joined before measuring: the host knows this member has arrived, and waits for its measurements
        me = await ep.announce({**identity(emulation), "role": "member", **claim, messages.MEASURING_KEY: True})
        view = replace(member_view(me), status="measuring")
        view.nat_evidence.update({"alt_port": report.mapped_alt_port, "alt_ip": report.mapped_alt_ip,
                                  "heard_change_ip_port": report.heard_change_ip_port,
                                  "heard_change_port": report.heard_change_port})
        state.upsert_member(view)
        state.set_phase("waiting", f"joined as {opts.name}; connecting to the host")
        control = await connect_host(ep, opts.join_timeout_s)
        state.coordinator = control.peer.name
        state.set_phase("measuring", "measuring this machine (the host knows this member has arrived)")
        result = await measure_connected(control, state, lambda on_step, on_wait, stop: cached_probe(
            default_model_path(), cache, on_step, False, opts.threads, on_wait=on_wait, stop=stop))
        meas = {**measurements(result, emulation), "role": "member", **claim}
        # announced too: a coordinator that takes over later reads a survivor's measurements from its announcement
        await ep.announce(meas)
        state.upsert_member(replace(member_view(ep.me or me), status="measured", nat_evidence=view.nat_evidence))
        await control.send(messages.encode(messages.MeasuredSelf(meas)))
        state.set_phase("waiting", f"measured; waiting for the host's plan as {opts.name}")
        api = None
        if opts.api_port is not None:
            api = await ApiServer(state, port=opts.api_port).start_or_none()
        try:
            return await MemberRuntime(ep, control, state, opts, cache, api, use).run()
        finally:
            if api:
                await api.stop()

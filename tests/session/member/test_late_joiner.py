"""A member joining late follows the coordinator most members follow (issue 34 item 6): a member holding the
join code who announces itself as a host, and is listed before the real one (as after the real host
re-registered at the rendezvous), does not draw the late joiner to it.

Real endpoints on an in-process rendezvous (tests/rendezvous/test_server.py's, watched)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from kafila.net.endpoint import PeerEndpoint
from kafila.session.member.host_link import announce_following, find_host
from tests.rendezvous.test_server import rendezvous

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


async def test_a_late_joiner_follows_the_coordinator_the_members_follow() -> None:
    async with rendezvous() as (rdv, w), AsyncExitStack() as stack:
        def endpoint(name: str) -> PeerEndpoint:
            return PeerEndpoint(bind=("127.0.0.1", 0), name=name, rendezvous_ping_s=0.05)

        host = await stack.enter_async_context(endpoint("host"))
        ada, bo, mallory, late = [await stack.enter_async_context(endpoint(n))
                                  for n in ("ada", "bo", "host", "late")]
        for ep in (host, ada, bo, mallory, late):
            await ep.probe_nat(rdv)
        code = await host.create_session(rdv)
        real = await host.announce({"role": "host"})
        for ep in (ada, bo):
            await ep.join_session(rdv, str(code))
            await ep.announce({"role": "member"})
            await announce_following(ep, real)
        await mallory.join_session(rdv, str(code))
        await mallory.announce({"role": "host"})  # holds the code, poses as the host
        w.core.table.remove(code.session_id, host.member_id)  # the real host registers again: listed last
        await w.until(lambda core: list(core.sessions[code.session_id].members)[-1] == host.member_id
                      and core.sessions[code.session_id].members[host.member_id].announcement is not None)
        await late.join_session(rdv, str(code))
        await late.announce({"role": "member"})
        listed = [vm for vm in (await late.members()).verified if vm.measurements.get("role") == "host"]
        assert [vm.member_id for vm in listed] == [mallory.member_id, host.member_id]  # mallory first
        found = await find_host(late, 30)
        assert found.member_id == host.member_id and found.fingerprint == host.identity.fingerprint

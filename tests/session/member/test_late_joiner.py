"""A member joining late finds the coordinator by its certificate, never by majority (issue 55, finding 3): a
member holding the join code who announces itself as a host, with four more member ids announcing that
they follow it, and listed before the real host (as after the real host re-registered at the rendezvous),
draws no late joiner; nor does one that announces a mandate it signed itself. A member that took
coordination over is found by the mandate its coordinator signed, once the host does not answer.

Real endpoints on an in-process rendezvous (tests/rendezvous/test_server.py's, watched)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from kafila.net.endpoint import PeerEndpoint
from kafila.net.mandate import CREDENTIAL_KEY, Credential
from kafila.session.coordinator.runtime import coordinator_announcement
from kafila.session.coordinator.session import open_session
from kafila.session.member.host_link import find_host
from tests.rendezvous.test_server import rendezvous

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]
FAKES = 4  # member ids one code holder makes, each announcing that it follows mallory


async def test_a_late_joiner_finds_the_coordinator_by_its_certificate_not_by_majority() -> None:
    async with rendezvous() as (rdv, w), AsyncExitStack() as stack:
        def endpoint(name: str) -> PeerEndpoint:
            return PeerEndpoint(bind=("127.0.0.1", 0), name=name, rendezvous_ping_s=0.05)

        host = await stack.enter_async_context(endpoint("host"))
        ada, bo, mallory, late, *fakes = [await stack.enter_async_context(endpoint(n))
                                          for n in ("ada", "bo", "mallory-host", "late",
                                                    *(f"fake{i}" for i in range(FAKES)))]
        for ep in (host, ada, bo, mallory, late, *fakes):
            await ep.probe_nat(rdv)
        code, credential = await open_session(host, rdv)
        for ep in (ada, bo, mallory, *fakes):
            await ep.join_session(rdv, str(code))
        for ep in (ada, bo):
            await ep.announce({"role": "member", "coord": host.identity.fingerprint[:8].hex()})
        # mallory holds the code and poses as the host, with a credential of its own making
        await mallory.announce({**coordinator_announcement(Credential.new_host())})
        for ep in fakes:  # more "followers" than the real host has
            await ep.announce({"role": "member", "coord": mallory.identity.fingerprint[:8].hex()})
        w.core.table.remove(code.session_id, host.member_id)  # the real host registers again: listed last
        await w.until(lambda core: list(core.sessions[code.session_id].members)[-1] == host.member_id
                      and core.sessions[code.session_id].members[host.member_id].announcement is not None)
        await late.join_session(rdv, str(code))
        await late.announce({"role": "member"})
        listed = [vm for vm in (await late.members()).verified if vm.measurements.get("role") == "host"]
        assert [vm.member_id for vm in listed] == [mallory.member_id, host.member_id]  # mallory first
        found = await find_host(late, 30)
        assert found.member_id == host.member_id and found.fingerprint == host.identity.fingerprint
        assert credential.links == ()


async def test_a_successor_is_found_by_its_mandate_and_a_self_signed_one_is_not() -> None:
    async with rendezvous() as (rdv, _w), AsyncExitStack() as stack:
        def endpoint(name: str) -> PeerEndpoint:
            return PeerEndpoint(bind=("127.0.0.1", 0), name=name, rendezvous_ping_s=0.05)

        host, heir, mallory, late = [await stack.enter_async_context(endpoint(n))
                                     for n in ("host", "heir", "mallory", "late")]
        for ep in (host, heir, mallory, late):
            await ep.probe_nat(rdv)
        code, credential = await open_session(host, rdv)
        for ep in (heir, mallory, late):
            await ep.join_session(rdv, str(code))
        # the host's roster mandates the heir (runtime._mandates); mallory signs one for itself
        mandated = credential.delegate(host.identity.key, code.session_id, heir.identity.fingerprint)
        forged = credential.delegate(mallory.identity.key, code.session_id, mallory.identity.fingerprint)
        assert mandated is not None and forged is not None
        await heir.announce(coordinator_announcement(mandated))
        await mallory.announce(coordinator_announcement(forged))
        assert (await find_host(late, 30)).member_id == host.member_id  # the host first, while it answers
        found = await find_host(late, 30, frozenset({host.member_id}))  # the host did not answer
        assert found.member_id == heir.member_id and found.measurements[CREDENTIAL_KEY] == mandated.as_json()

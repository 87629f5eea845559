"""Ring edges and a taken-over coordinator are found by the certificate the coordinator admitted, not by name
(issue 34 item 6): a member holding the join code that announces another member's name (or role "host" with
the heir's name) later than it gets no edge, and no survivor follows it.

A real member (MemberRuntime) in a session on an in-process rendezvous; the test is its coordinator and
drives bo, its neighbour, and mallory, who announces herself as "bo" after bo did."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from kafila.session.coordinator.runtime import coordinator_announcement
from kafila.session.delivery.transfer import send_stage
from kafila.session.member.host_link import find_host
from kafila.session.protocol import messages
from tests.session.scripted import assign, endpoint, host_stage, member, member_measurements

pytestmark = pytest.mark.fast


async def test_an_edge_opens_to_the_admitted_member_not_to_a_later_namesake(tmp_path: Path) -> None:
    source, manifest = host_stage(tmp_path)
    async with member(tmp_path, "ada", others=["bo"]) as m, contextlib.AsyncExitStack() as stack:
        bo = m.others["bo"]
        await asyncio.sleep(1.1)  # mallory's announcement is the newer one, by its timestamp
        mallory, _ = await endpoint(stack, m.runtime.opts.rendezvous, "bo", m.runtime.opts.code,
                                    member_measurements())
        fps = {"ada": m.runtime.ep.identity.fingerprint.hex(), "bo": bo.identity.fingerprint.hex()}
        await m.host.send(assign(1, manifest, fps))
        need = await m.first(messages.Need)
        await send_stage(m.host.inbox.link, source, manifest, list(need.chunks))
        await m.first(messages.Loaded)
        ring = {vm.name: vm for vm in (await bo.members()).verified
                if vm.name == "ada" or vm.fingerprint == bo.identity.fingerprint}
        await m.host.send(messages.Connect(1))
        edges = await bo.open_ring([ring["bo"], ring["ada"]])
        await m.first(messages.Ready)
        assert m.runtime.ring.edges is not None and m.runtime.ring.edges.next is not None and edges.next is not None
        assert m.runtime.ring.edges.next.peer.fingerprint == bo.identity.fingerprint  # not mallory's
        assert mallory.identity.fingerprint != bo.identity.fingerprint
        await m.host.send(messages.Bye("the test is over"))
        assert await m.run == 0


async def test_the_heir_is_found_by_its_certificate(tmp_path: Path) -> None:
    async with member(tmp_path, "ada", others=["cy"]) as m, contextlib.AsyncExitStack() as stack:
        rdv, code = m.runtime.opts.rendezvous, m.runtime.opts.code
        heir = m.others["cy"]
        # cy coordinates now, from its own certificate (as takeover.coordinate does); mallory poses as it, later
        as_host, _ = await endpoint(stack, rdv, "cy", code, coordinator_announcement(None), identity=heir.identity)
        await asyncio.sleep(1.1)
        mallory, _ = await endpoint(stack, rdv, "cy", code, coordinator_announcement(None))
        found = await find_host(m.runtime.ep, 30, frozenset(), "cy", heir.identity.fingerprint)
        assert found.member_id == as_host.member_id and found.fingerprint == heir.identity.fingerprint
        assert found.member_id != mallory.member_id

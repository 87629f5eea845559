"""The member list a member builds from the rendezvous's pages (kafila.net.members), without sockets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kafila.net.members import fetch_members
from kafila.net.rdvclient import RendezvousClient
from kafila.net.trust import Announcement, JoinCode, now_wall

pytestmark = pytest.mark.fast


class ListingClient(RendezvousClient):
    """A rendezvous client whose `list` answers come from a fixed page (a hostile rendezvous's choice)."""

    def __init__(self, code: JoinCode, entries: list[dict[str, Any]]) -> None:
        super().__init__(b"me" * 4, lambda data, addr: None)
        self.code, self.entries = code, entries

    async def list_page(self, start: int) -> dict[str, Any]:
        return {"ok": True, "total": len(self.entries), "members": self.entries[start:]}


def sealed(code: JoinCode, mid: bytes, t: float) -> str:
    ann = Announcement(code.session_id, mid, "ana", b"f" * 32, "ordinary", ("100.64.0.11", 4000), None, 1.5, {}, t,
                       b"p" * 32)
    return ann.seal(code)


async def test_a_replayed_older_announcement_of_a_known_member_is_refused() -> None:
    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    mid, now = b"a" * 8, now_wall()
    old, new = sealed(code, mid, now - 120), sealed(code, mid, now - 5)
    entry = {"id": mid.hex(), "obs": ["127.0.0.1", 4000]}

    first = await fetch_members(ListingClient(code, [{**entry, "ann": new}]))
    assert [v.member_id for v in first.verified] == [mid]
    known = {mid: first.verified[0]}

    replay = await fetch_members(ListingClient(code, [{**entry, "ann": old}]), known)
    assert replay.verified == ()
    assert replay.rejected == ((mid.hex()[:8], replay.rejected[0][1]),)
    assert "older than one already seen" in replay.rejected[0][1]
    # without what was known, the same old announcement is still fresh enough on its own
    assert len((await fetch_members(ListingClient(code, [{**entry, "ann": old}]))).verified) == 1


async def test_a_changed_fingerprint_or_a_member_listed_twice_is_refused_and_nothing_recorded() -> None:
    # untested guards (issue 34): a member id announcing another certificate mid-session, and a doubled entry
    from kafila.errors import SessionError
    from kafila.net.members import MemberList, merge_peers

    code = JoinCode("k7q2m9xd", JoinCode.new_secret())
    mid, now = b"a" * 8, now_wall()
    listed = await fetch_members(ListingClient(code, [{"id": mid.hex(), "obs": ["127.0.0.1", 4000],
                                                       "ann": sealed(code, mid, now - 5)}]))
    peers: dict = {}
    merge_peers(peers, listed)
    first = peers[mid]
    swapped = MemberList((replace(first, fingerprint=b"g" * 32), replace(first, member_id=b"b" * 8)), ())
    with pytest.raises(SessionError, match="changed its certificate fingerprint mid-session"):
        merge_peers(peers, swapped)
    assert peers == {mid: first}  # the whole list refused: not even the new member b recorded
    # its punch key is pinned the same way: a new one would give whoever announced it the member's punch frames
    with pytest.raises(SessionError, match="changed its punch key mid-session"):
        merge_peers(peers, MemberList((replace(first, punch_public=b"q" * 32),), ()))
    assert peers == {mid: first}
    with pytest.raises(SessionError, match="listed one member twice"):
        merge_peers(peers, MemberList((replace(first, member_id=b"c" * 8),) * 2, ()))
    assert peers == {mid: first}

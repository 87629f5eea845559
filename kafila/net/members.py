"""The session's member list as a member trusts it: paged from the rendezvous, each announcement verified.

The rendezvous only stores and lists; every entry is checked here against the join code's
announce key (kafila.net.trust), so a hostile rendezvous can neither add a member nor swap a
fingerprint. A member whose fingerprint or punch key changes mid-session is refused outright.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kafila.errors import ProtocolError, SessionError
from kafila.net import wire
from kafila.net.rdvclient import RendezvousClient
from kafila.net.trust import VerifiedMember, open_announcement

log = logging.getLogger("kafila.net")
MAX_PAGES = 64


@dataclass(frozen=True)
class MemberList:
    """Members whose announcements verified, and the entries refused (short id, reason)."""

    verified: tuple[VerifiedMember, ...]
    rejected: tuple[tuple[str, str], ...]


async def fetch_members(client: RendezvousClient, known: Mapping[bytes, VerifiedMember] | None = None) -> MemberList:
    """Every listed member whose announcement verifies under our join code; the others, refused.

    An announcement older than the one already `known` from that member is refused (a replay).
    """
    code = client.code
    if code is None:
        raise SessionError("join a session first")
    verified: list[VerifiedMember] = []
    rejected: list[tuple[str, str]] = []
    start, total = 0, 1
    for _ in range(MAX_PAGES):  # bounded paging
        if start >= total:
            break
        reply = await client.list_page(start)
        total = wire.get_int(reply, "total", 0, 1024)
        page = reply.get("members")
        if not isinstance(page, list) or not page:
            break
        for entry in page:
            try:
                if not isinstance(entry, dict):
                    raise ProtocolError("member entry is not an object")
                mid = wire.get_hex(entry, "id", wire.ID_LEN)
                obs = wire.get_addr(entry.get("obs"), "obs")
                verified.append(open_announcement(wire.get_str(entry, "ann", 1300), code, mid, obs,
                                                  previous=(known or {}).get(mid)))
            except (ProtocolError, SessionError) as exc:
                raw_id = entry.get("id") if isinstance(entry, dict) else None
                short = raw_id[:8] if isinstance(raw_id, str) else "?"
                log.warning("refused member %s: %s", short, exc)
                rejected.append((short, str(exc)))
        start += len(page)
    return MemberList(tuple(verified), tuple(rejected))


def merge_peers(peers: dict[bytes, VerifiedMember], ml: MemberList) -> None:
    """Record a verified list in `peers`; SessionError for a duplicate or a changed fingerprint (nothing recorded)."""
    ids = [v.member_id for v in ml.verified]
    if len(set(ids)) != len(ids):
        raise SessionError("the rendezvous listed one member twice: refusing the list")
    for v in ml.verified:
        old = peers.get(v.member_id)
        if old is not None and old.fingerprint != v.fingerprint:
            raise SessionError(f"member {v.short_id} changed its certificate fingerprint mid-session: refused")
        if old is not None and old.punch_public != v.punch_public:
            raise SessionError(f"member {v.short_id} changed its punch key mid-session: refused")
    for v in ml.verified:
        peers[v.member_id] = v

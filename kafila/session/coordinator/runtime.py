"""The coordinator a session runs: the host's, or a member's that took coordination over (member.takeover).

HostRuntime joins the coordinator's parts over their shared core: admission (members arriving), member_messages
(what they say), epochs (plan, deliver, admit, watch) and losses (a member lost, the ring planned again).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from kafila.engine.build import build_identity
from kafila.errors import KafilaError
from kafila.model.describe import ModelInfo
from kafila.model.stage_cache import StageCache
from kafila.net.endpoint import PeerEndpoint
from kafila.net.mandate import CREDENTIAL_KEY, Credential
from kafila.session.api.server import ApiServer
from kafila.session.coordinator.admission import Admission
from kafila.session.coordinator.builds import build_tag
from kafila.session.coordinator.epochs import Epochs
from kafila.session.coordinator.member_messages import MemberMessages
from kafila.session.delivery.cache_inventory import InUse
from kafila.session.options import HostOptions
from kafila.session.protocol import messages
from kafila.session.state import SessionState


class HostRuntime(Admission, MemberMessages, Epochs):
    """The host's session after it is open (see coordinator.session.coordinate_session)."""

    def __init__(self, ep: PeerEndpoint, opts: HostOptions, state: SessionState, model: Path, info: ModelInfo,
                 cache: StageCache, api: ApiServer | None, use: InUse | None = None, beside: str | None = None,
                 serving: messages.Assign | None = None, departed: frozenset[str] = frozenset(),
                 credential: Credential | None = None) -> None:
        super().__init__(ep, opts, state, model, info, cache, api, use, beside, serving, departed, credential)
        self._handlers.update({
            messages.Need: self._on_need,
            messages.Working: self._on_working,
            messages.Loaded: self._on_loaded,
            messages.Ready: self._on_ready,
            messages.Lost: self._on_lost_report,
            messages.Stats: self._on_stats,
            messages.ChatEvt: self._on_chat_evt,
            messages.CopyNeed: self._on_copy_need,
            messages.Copied: self._on_copied,
        })

    async def run(self) -> int:
        """Coordinate until the session ends; returns its exit status."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            accept = tg.create_task(self._accept_loop())
            reason = "the host is closing the session"
            try:
                await self._wait_for_members()
                status = None if self.serving is None else await self._adopt(self.serving)
                while status is None:
                    status = await self._epoch()
                return status
            except KafilaError as exc:  # the members still measuring say why, not only that the host went
                reason = f"the host ended the session: {exc}"
                raise
            finally:
                accept.cancel()
                for link in [j.link for j in self.joined.values()] + [a.link for a in self.measuring.values()]:
                    with contextlib.suppress(KafilaError):
                        link.post(messages.encode(messages.Bye(reason)))
                await asyncio.sleep(0.2)  # let the goodbyes leave before the endpoint closes


def coordinator_announcement(credential: Credential | None) -> dict[str, Any]:
    """What a coordinator's endpoint announces (the host's, or a member's that took coordination over), with the
    credential that shows members it coordinates (kafila.net.mandate; None: it can show none)."""
    found = {} if credential is None else {CREDENTIAL_KEY: credential.as_json()}
    return {"role": "host", "build": build_tag(build_identity()), **found}


def relay_events(source: SessionState, into: SessionState, prefix: str) -> None:
    """Show every event of `source` (a coordinator or member beside the main one) in `into`'s log."""
    shown = 0

    def relay(s: SessionState) -> None:
        nonlocal shown
        for _, text in s.events[shown:]:
            into.log(f"{prefix}{text}")
        shown = len(s.events)

    source.subscribe(relay)

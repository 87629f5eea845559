"""What the coordinator's machine asks its shell to do: frozen effects, carried out in order (runtime.py).

The machine (machine.py) decides; these are its only way to reach the world. A send that fails is reported
back to the machine as that member's loss (`Coordinator.link_down`), never raised.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafila.planner.placement import Placement
from kafila.session.coordinator.loss_reports import Probe
from kafila.session.protocol import messages


@dataclass(frozen=True)
class Send:
    """Send `msg` to member `to` on its control link."""

    to: str
    msg: messages.Control


@dataclass(frozen=True)
class Cut:
    """Cut every stage of `placement` and assign each to its member (epoch `epoch`); then `delivered`."""

    epoch: int
    placement: Placement


@dataclass(frozen=True)
class Serve:
    """The ring `order` is admitted: its head serves the coordinator's API."""

    order: tuple[str, ...]


@dataclass(frozen=True)
class Announce:
    """Send the roster (the coordinator's replicated state) to the ring `order`, and offer a model copy."""

    order: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """The ring stops: the requests in flight end, resumable, naming `reason` (and the member `lost`, if any);
    stage chunks in flight for the epoch ending stop too."""

    reason: str
    lost: str | None = None


@dataclass(frozen=True)
class Close:
    """Member `who` is out of the session: close its link."""

    who: str


@dataclass(frozen=True)
class Pass:
    """A member's message whose work is the shell's: the stage chunks it asks for (`need`, of this epoch), the
    head's answer to the API (`chat_evt`), a model copy's next batch or its end (`copy_need`, `copied`)."""

    who: str
    msg: messages.Need | messages.ChatEvt | messages.CopyNeed | messages.Copied


@dataclass(frozen=True)
class Exit:
    """The session ends with this exit status."""

    status: int


Effect = Send | Cut | Serve | Announce | Stop | Close | Pass | Exit | Probe

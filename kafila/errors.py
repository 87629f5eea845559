"""One exception tree; every user-visible failure is a KafilaError with a message for a person."""


class KafilaError(Exception):
    """A failure whose message is meant for the user; the CLI prints it without a traceback."""


class ModelError(KafilaError):
    """The model file is missing, corrupt, or of an unsupported kind."""


class EngineError(KafilaError):
    """llama.cpp refused or failed to run a stage."""


class PlanInputError(KafilaError):
    """A fleet or model description is malformed."""


class ProtocolError(KafilaError):
    """A peer sent bytes that do not parse as the protocol says."""


class NeighbourFault(ProtocolError):
    """A ring neighbour sent what no honest stage sends (a sequence outside the admitted slots, a free of a
    slot the head never freed): the stage stops taking its input, and it is reported lost."""


class NetworkError(KafilaError):
    """A peer or the rendezvous cannot be reached, or a connection failed."""


class WorkStopped(KafilaError):
    """Work on a worker thread (a cut, a hash) stopped early because what waited for it was cancelled."""


class CacheError(KafilaError):
    """The cache directory is not this user's alone: another user could plant stages in it."""


class SessionError(KafilaError):
    """A session could not be joined, admitted, or kept alive."""


class SessionEnded(SessionError):
    """A ring neighbour said the session cannot go on (a `bye` on a ring edge); the message says why."""


class RendezvousError(SessionError):
    """The rendezvous refused a request; `code` is the machine-readable reason from its reply."""

    code = "refused"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class WrongJoinCode(RendezvousError):
    """The join code's secret does not match the session (code "wrong_code")."""

    code = "wrong_code"


class UnknownSession(RendezvousError):
    """The rendezvous has no such session: expired, or a mistyped code (code "unknown_session")."""

    code = "unknown_session"


class NotMember(RendezvousError):
    """The member is not registered in the session, or not from this address (code "not_member")."""

    code = "not_member"


class MemberExists(RendezvousError):
    """A first join for a member id the session already has (code "member_exists")."""

    code = "member_exists"


class RendezvousBusy(RendezvousError):
    """Rate-limited, or no room for another session or member (codes "rate_limited", "full")."""

    code = "rate_limited"


class RejoinRefused(RendezvousError):
    """A re-join whose nonce was stale, reused or unknown, or whose MAC was wrong ("stale_nonce", "bad_mac")."""

    code = "stale_nonce"


class CookieNeeded(RendezvousError):
    """The rendezvous asks for a request again with its return-routability cookie (rendezvous.cookies)."""

    def __init__(self, cookie: str) -> None:
        super().__init__("send the request again with this cookie", "cookie")
        self.cookie = cookie


RENDEZVOUS_CODES: dict[str, type[RendezvousError]] = {
    "wrong_code": WrongJoinCode,
    "unknown_session": UnknownSession,
    "not_member": NotMember,
    "member_exists": MemberExists,
    "rate_limited": RendezvousBusy,
    "full": RendezvousBusy,
    "stale_nonce": RejoinRefused,
    "bad_mac": RejoinRefused,
    "bad_request": RendezvousError,
    "cookie": RendezvousError,  # answered by the client itself (kafila.net.rdvclient), never shown
}


class DiskFullError(SessionError):
    """A stage does not fit on this machine's disk (checked before a transfer, or ENOSPC while writing)."""


def first_kafila_error(group: BaseExceptionGroup) -> KafilaError | None:
    """The first KafilaError in an exception group (a TaskGroup's), searched depth first; None if it holds none."""
    for exc in group.exceptions:
        if isinstance(exc, KafilaError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and (inner := first_kafila_error(exc)):
            return inner
    return None

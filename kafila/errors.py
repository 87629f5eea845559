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


class NetworkError(KafilaError):
    """A peer or the rendezvous cannot be reached, or a connection failed."""


class SessionError(KafilaError):
    """A session could not be joined, admitted, or kept alive."""

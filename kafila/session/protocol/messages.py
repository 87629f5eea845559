"""Session messages carried over links (kafila.net Link: whole messages, in order, encrypted).

Three kinds, told apart by their first bytes:

    b"KFA1" ...   activation frame (kafila.session.protocol.frames): hidden-state rows moving around the ring
    b"KFC1" ...   stage chunk: u32 index | raw bytes of one chunk of a stage file (host → member)
    b"{" ...      a control message: one UTF-8 JSON object whose "t" names its type, below

Control messages, each a frozen dataclass here (every field is required; "|null" marks the ones
that may be null; fields this build does not know are ignored):

    assign    host → member   epoch, order [names, head first], head (= order[0]),
                              ranges {name: [start, end)} for every name in order,
                              config {n_ctx_per_seq, n_seq_max, n_batch}, plan (the planner's JSON;
                              its "stage_seconds" {name: s} are read), model (the name to show),
                              stage {sha256, size, chunk_size, chunks [sha256 per chunk]},
                              cut_local (true: the member holds the host's model file, announced by
                              its sha256, and cuts the stage itself; no chunks are sent)
    need      member → host   epoch, chunks [indices the member still lacks] (empty: it has the stage)
    working   member → host   epoch, step (e.g. "receiving its stage", "loading its stage"): still busy
                              with a step the host cannot watch (each second; kafila.session.control.heartbeat)
    loaded    member → host   epoch (stage received, verified and loaded into llama.cpp)
    connect   host → member   epoch (every stage is loaded: open the ring edges now)
    ready     member → host   epoch, edge {predicted, actual, ready_ms|null, error|null}|null
                              (its outgoing ring edge; null for a ring of one)
    admit     host → member   epoch
    reject    host → member   reason (the planner's text)
    refused   host → member   reason (this member cannot take part, e.g. a different llama.cpp build)
    lost      any → host/all  who, reason, epoch
    stats     head → host     stages {name: {predicted_s, measured_s|null}}, network_share|null,
                              tokens_per_s|null, ttft {prompt_tokens, measured_s, predicted_s|null}|null
                              (the latest request's time to first token, and the plan's for as many
                              prompt tokens)
    free      ring            seq (drop that KV-cache sequence; travels the whole ring back to the head)
    trim      ring            seq, keep (drop that sequence's positions from keep on, so a new request
                              reuses the rest; travels the ring back to the head, ahead of the frames
                              that rely on it)
    chat      ring / control  id, origin, body (an OpenAI chat request, optionally "resume": [token ids]
                              an earlier ring generated), forwarded to the head
    chat_evt  ring / control  id, dest, evt: {"delta": str, "tokens": [ids]} | {"done": {...stats}} |
                              {"error": str, "resumable": bool} | {"notice": str} |
                              {"progress": {"prefilled": n, "prompt_tokens": n}}
    roster    host → member   coordinator, model, members {name: {bw, disp, mem, ubw, nat, rtt_ms|null}},
                              beside|null (the ring member in the coordinator's own process, lost with
                              it; null: it only coordinates), holders [names holding the model file,
                              verified by sha256], model_sha256|null, strategy, mixed_builds
                              (the coordinator's state, replicated at each admission: who serves, what
                              each measured, and what a member needs to take coordination over, so
                              that the ring outlives its host; kafila.session.control.takeover)
    bye       any             reason (closing on purpose; on a ring edge: the session cannot go on)

decode() checks every field's type and range from one table (SCHEMA); anything malformed is a
ProtocolError naming what is wrong, never another exception.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from kafila.errors import ProtocolError
from kafila.session.protocol.frames import MAGIC as FRAME_MAGIC
from kafila.session.protocol.manifest import StageManifest

DEFAULT_MAX_TOKENS = 256  # a chat request's max_tokens when it names none
CHUNK_MAGIC = b"KFC1"
MAX_CONTROL = 4 * 1024 * 1024
MAX_NAME = 255
MAX_TEXT = 64 * 1024
MAX_INDEX = (1 << 31) - 1
CONFIG_KEYS = ("n_ctx_per_seq", "n_seq_max", "n_batch")


def kind(msg: bytes) -> str:
    """'frame', 'chunk' or 'control'."""
    if msg[:4] == FRAME_MAGIC:
        return "frame"
    if msg[:4] == CHUNK_MAGIC:
        return "chunk"
    if msg[:1] == b"{":
        return "control"
    raise ProtocolError(f"unknown session message starting {msg[:4]!r}")


# -- the messages ---------------------------------------------------------------------------------
class Control:
    """A control message; T is its "t" on the wire."""

    T: ClassVar[str]


@dataclass(frozen=True)
class EdgeOutcome:
    """A member's outgoing ring edge: predicted against what verification found."""

    predicted: str
    actual: str  # "direct", "relay" or "failed"
    ready_ms: float | None
    error: str | None


@dataclass(frozen=True)
class StageTime:
    """One stage's predicted and measured compute time per call, in seconds."""

    predicted_s: float
    measured_s: float | None


@dataclass(frozen=True)
class TtftTime:
    """The latest request's time to first token against the plan's prediction for its prompt."""

    prompt_tokens: int  # the tokens it prefilled (those a reused cache held are not counted)
    measured_s: float  # from its arrival at the head to its first token
    predicted_s: float | None  # the plan's TTFT for as many tokens (None: the plan predicts none)


@dataclass(frozen=True)
class Assign(Control):
    T = "assign"
    epoch: int
    order: tuple[str, ...]
    head: str
    ranges: dict[str, tuple[int, int]]
    config: dict[str, int]
    plan: dict[str, Any]
    model: str
    stage: StageManifest
    cut_local: bool = False

    @property
    def stage_seconds(self) -> dict[str, float]:
        """The planner's predicted stage time per member (validated by decode)."""
        return dict(self.plan.get("stage_seconds") or {})


@dataclass(frozen=True)
class _Epoch(Control):
    """A message that only names the epoch it belongs to (its type says the rest)."""

    epoch: int


@dataclass(frozen=True)
class _Reason(Control):
    """A message that only carries a reason for a person."""

    reason: str


@dataclass(frozen=True)
class Need(Control):
    T = "need"
    epoch: int
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class Working(Control):
    T = "working"
    epoch: int
    step: str


class Loaded(_Epoch):
    T = "loaded"


class Connect(_Epoch):
    T = "connect"


@dataclass(frozen=True)
class Ready(Control):
    T = "ready"
    epoch: int
    edge: EdgeOutcome | None


class Admit(_Epoch):
    T = "admit"


class Reject(_Reason):
    T = "reject"


class Refused(_Reason):
    T = "refused"


@dataclass(frozen=True)
class Lost(Control):
    T = "lost"
    who: str
    reason: str
    epoch: int


@dataclass(frozen=True)
class Stats(Control):
    T = "stats"
    stages: dict[str, StageTime]
    network_share: float | None
    tokens_per_s: float | None
    ttft: TtftTime | None = None


@dataclass(frozen=True)
class Free(Control):
    T = "free"
    seq: int


@dataclass(frozen=True)
class Trim(Control):
    T = "trim"
    seq: int
    keep: int


@dataclass(frozen=True)
class Chat(Control):
    T = "chat"
    id: str
    origin: str
    body: dict[str, Any]


@dataclass(frozen=True)
class ChatEvt(Control):
    T = "chat_evt"
    id: str
    dest: str
    evt: dict[str, Any]


class Bye(_Reason):
    T = "bye"


@dataclass(frozen=True)
class Measured:
    """One member as the planner saw it: its measurements (kafila.planner.Member's numbers)."""

    bw: float
    disp: float
    mem: int
    ubw: float
    nat: str
    rtt_ms: float | None


@dataclass(frozen=True)
class Roster(Control):
    T = "roster"
    coordinator: str
    model: str
    members: dict[str, Measured]
    beside: str | None = None
    holders: tuple[str, ...] = ()
    model_sha256: str | None = None
    strategy: str = "kafila"
    mixed_builds: bool = False


# -- field checks: (value, where) -> the decoded value, or ProtocolError --------------------------
Check = Callable[[Any, str], Any]


def _int(lo: int, hi: int) -> Check:
    def check(v: Any, where: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ProtocolError(f"{where} must be an integer in [{lo}, {hi}]")
        return v
    return check


def _num(lo: float, hi: float) -> Check:
    def check(v: Any, where: str) -> float:
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
            raise ProtocolError(f"{where} must be a number in [{lo:g}, {hi:g}]")
        return float(v)
    return check


def _str(max_len: int, min_len: int = 0) -> Check:
    def check(v: Any, where: str) -> str:
        if not isinstance(v, str) or not min_len <= len(v) <= max_len:
            raise ProtocolError(f"{where} must be a string of {min_len} to {max_len} characters")
        return v
    return check


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ProtocolError(f"{where} must be true or false")
    return v


def _null_or(inner: Check) -> Check:
    def check(v: Any, where: str) -> Any:
        return None if v is None else inner(v, where)
    return check


def _list(item: Check, max_len: int | None = None) -> Check:
    def check(v: Any, where: str) -> tuple[Any, ...]:
        if not isinstance(v, list) or (max_len is not None and len(v) > max_len):
            raise ProtocolError(f"{where} must be a list" + (f" of at most {max_len} items" if max_len else ""))
        return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))
    return check


def _map(value: Check) -> Check:
    def check(v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ProtocolError(f"{where} must be an object")
        return {_NAME(k, f"a key of {where}"): value(x, f"{where}[{k!r}]") for k, x in v.items()}
    return check


def _object(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object")
    return v


def _record(cls: type, checks: dict[str, Check]) -> Check:
    """A nested object decoded into the dataclass `cls`."""
    def check(v: Any, where: str) -> Any:
        return cls(**_fields(_object(v, where), checks, where))
    return check


_NAME = _str(MAX_NAME, 1)
_NAMES = _list(_NAME, 64)
_EPOCH = _int(0, MAX_INDEX)
_TEXT = _str(MAX_TEXT)
_SECONDS = _num(0.0, 1e9)
_SHA256 = _str(64, 64)


def _range(v: Any, where: str) -> tuple[int, int]:
    if not isinstance(v, list) or len(v) != 2:
        raise ProtocolError(f"{where} must be a block range [start, end)")
    start, end = (_int(0, MAX_INDEX)(x, where) for x in v)
    if not start < end:
        raise ProtocolError(f"{where} must be a block range [start, end) with start < end")
    return start, end


def _config(v: Any, where: str) -> dict[str, int]:
    obj = _object(v, where)
    return {k: _int(1, 1 << 24)(obj.get(k), f"{where}.{k}") for k in CONFIG_KEYS}


def _plan(v: Any, where: str) -> dict[str, Any]:
    obj = _object(v, where)
    _map(_SECONDS)(obj.get("stage_seconds", {}), f"{where}.stage_seconds")
    return obj


def _manifest(v: Any, where: str) -> StageManifest:
    obj = _object(v, where)
    # the types first, so that the manifest's own consistency check sees only sane numbers
    _SHA256(obj.get("sha256"), f"{where}.sha256")
    _int(0, 1 << 50)(obj.get("size"), f"{where}.size")
    _int(1, 1 << 32)(obj.get("chunk_size"), f"{where}.chunk_size")
    _list(_SHA256)(obj.get("chunks"), f"{where}.chunks")
    return StageManifest.from_dict(obj)


def _event(v: Any, where: str) -> dict[str, Any]:
    obj = _object(v, where)
    if "delta" in obj:
        _str(MAX_CONTROL)(obj["delta"], f"{where}.delta")
        _list(_int(0, MAX_INDEX))(obj.get("tokens"), f"{where}.tokens")
    elif "done" in obj:
        _object(obj["done"], f"{where}.done")
    elif "error" in obj or "notice" in obj:
        _TEXT(obj.get("error", obj.get("notice")), f"{where}'s text")
    elif "progress" in obj:
        progress = _object(obj["progress"], f"{where}.progress")
        for name in ("prefilled", "prompt_tokens"):
            _int(0, MAX_INDEX)(progress.get(name), f"{where}.progress.{name}")
    else:
        raise ProtocolError(f"{where} must carry one of delta, done, error, notice, progress")
    return obj


_EDGE = _record(EdgeOutcome, {"predicted": _NAME, "actual": _NAME, "ready_ms": _null_or(_SECONDS),
                              "error": _null_or(_TEXT)})
_MEASURED = _record(Measured, {"bw": _num(0.0, 1e15), "disp": _SECONDS, "mem": _int(0, 1 << 60),
                              "ubw": _num(0.0, 1e15), "nat": _NAME, "rtt_ms": _null_or(_SECONDS)})
_STAGE_TIME = _record(StageTime, {"predicted_s": _SECONDS, "measured_s": _null_or(_SECONDS)})
_TTFT = _record(TtftTime, {"prompt_tokens": _int(0, MAX_INDEX), "measured_s": _SECONDS,
                           "predicted_s": _null_or(_SECONDS)})

# The one decode table: each type's class and a check per field.
SCHEMA: dict[str, tuple[type[Control], dict[str, Check]]] = {
    "assign": (Assign, {"epoch": _EPOCH, "order": _NAMES, "head": _NAME, "ranges": _map(_range),
                        "config": _config, "plan": _plan, "model": _TEXT, "stage": _manifest,
                        "cut_local": _bool}),
    "need": (Need, {"epoch": _EPOCH, "chunks": _list(_int(0, MAX_INDEX))}),
    "working": (Working, {"epoch": _EPOCH, "step": _NAME}),
    "loaded": (Loaded, {"epoch": _EPOCH}),
    "connect": (Connect, {"epoch": _EPOCH}),
    "ready": (Ready, {"epoch": _EPOCH, "edge": _null_or(_EDGE)}),
    "admit": (Admit, {"epoch": _EPOCH}),
    "reject": (Reject, {"reason": _TEXT}),
    "refused": (Refused, {"reason": _TEXT}),
    "lost": (Lost, {"who": _NAME, "reason": _TEXT, "epoch": _EPOCH}),
    "stats": (Stats, {"stages": _map(_STAGE_TIME), "network_share": _null_or(_num(0.0, 1.0)),
                      "tokens_per_s": _null_or(_num(0.0, 1e9)), "ttft": _null_or(_TTFT)}),
    "free": (Free, {"seq": _int(0, 0xFFFF)}),
    "trim": (Trim, {"seq": _int(0, 0xFFFF), "keep": _int(0, MAX_INDEX)}),
    "chat": (Chat, {"id": _NAME, "origin": _NAME, "body": _object}),
    "chat_evt": (ChatEvt, {"id": _NAME, "dest": _NAME, "evt": _event}),
    "bye": (Bye, {"reason": _TEXT}),
    "roster": (Roster, {"coordinator": _NAME, "model": _TEXT, "members": _map(_MEASURED),
                        "beside": _null_or(_NAME), "holders": _NAMES, "model_sha256": _null_or(_SHA256),
                        "strategy": _NAME, "mixed_builds": _bool}),
}


def _fields(obj: dict[str, Any], checks: dict[str, Check], where: str) -> dict[str, Any]:
    missing = [name for name in checks if name not in obj]
    if missing:
        raise ProtocolError(f"{where}: missing field {', '.join(missing)}")
    return {name: check(obj[name], f"{where}: {name}") for name, check in checks.items()}


def _assign_consistent(msg: Assign) -> None:
    if len(set(msg.order)) != len(msg.order) or not msg.order or msg.head != msg.order[0]:
        raise ProtocolError("'assign': the order must name each member once, the head first")
    if set(msg.ranges) != set(msg.order):
        raise ProtocolError("'assign': every member of the order needs a block range, and only they")


def decode(raw: bytes) -> Control:
    """A control message from its bytes; ProtocolError for anything malformed."""
    if len(raw) > MAX_CONTROL:
        raise ProtocolError(f"control message of {len(raw)} bytes exceeds {MAX_CONTROL}")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep for the parser
        raise ProtocolError(f"control message is not JSON: {str(exc)[:80]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("control message is not a JSON object")
    t = obj.get("t")
    entry = SCHEMA.get(t) if isinstance(t, str) else None
    if entry is None:
        raise ProtocolError(f"control message of unknown type {str(t)[:40]!r}")
    cls, checks = entry
    msg = cls(**_fields(obj, checks, f"'{t}' message"))
    if isinstance(msg, Assign):
        _assign_consistent(msg)
    return msg


def _plain(v: Any) -> Any:
    """A message field as JSON data."""
    if isinstance(v, StageManifest):
        return v.as_dict()
    if isinstance(v, EdgeOutcome | StageTime | TtftTime | Measured):
        return {f.name: getattr(v, f.name) for f in fields(v)}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def encode(msg: Control) -> bytes:
    """The wire bytes of a control message."""
    assert isinstance(msg, Control) and msg.T in SCHEMA, msg
    body = {"t": msg.T, **{f.name: _plain(getattr(msg, f.name)) for f in fields(msg)}}  # type: ignore[arg-type]
    return json.dumps(body, separators=(",", ":")).encode()


_CHUNK = struct.Struct("<4sI")


def chunk(index: int, data: bytes) -> bytes:
    """Encode one stage-file chunk."""
    return _CHUNK.pack(CHUNK_MAGIC, index) + data


def parse_chunk(msg: bytes) -> tuple[int, bytes]:
    """Decode a stage-file chunk into (index, bytes)."""
    if len(msg) < _CHUNK.size:
        raise ProtocolError("stage chunk shorter than its header")
    magic, index = _CHUNK.unpack_from(msg)
    if magic != CHUNK_MAGIC:
        raise ProtocolError("not a stage chunk")
    return index, msg[_CHUNK.size :]

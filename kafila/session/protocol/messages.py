"""Session messages carried over links (kafila.net Link: whole messages, in order, encrypted).

Three kinds, told apart by their first bytes:

    b"KFA1" ...   activation frame (kafila.session.protocol.frames): hidden-state rows moving around the ring
    b"KFC1" ...   stage chunk: u32 index | raw bytes of one chunk of a stage file (host → member)
    b"KFM1" ...   model-copy chunk: the same layout, one chunk of the model file (host → heir)
    b"{" ...      a control message: one UTF-8 JSON object whose "t" names its type, below

Control messages, each a frozen dataclass here (every field is required; "|null" marks the ones
that may be null; fields this build does not know are ignored):

    assign    host → member   epoch, order [names, head first], head (= order[0]),
                              ranges {name: [start, end)} for every name in order,
                              settings {every field of kafila.session.settings.SessionSettings} (which a
                              member taking coordination over runs with unchanged), plan (the planner's
                              JSON; its "stage_seconds" {name: s} are read), model (the name to show),
                              stage {sha256, size, chunk_size, chunks [sha256 per chunk]}, cut_local (true:
                              the member holds the host's model, announced by its sha256, and cuts the stage
                              itself), fingerprints {name: sha256 of its certificate}, source {manifest
                              {sha256, size, chunk_size, digests}, urls}|null (public URLs of the model: the
                              member fetches its stage's chunks there, checked, and cuts it; the host sends
                              what they cannot bring)
    need      member → host   epoch, chunks [indices the member still lacks] (empty: it has the stage)
    working   member → host   epoch, step (e.g. "loading its stage"), held|null (bytes of its stage from a URL):
                              still busy with a step the host cannot watch (each second; member.heartbeat)
    loaded    member → host   epoch (stage received, verified and loaded into llama.cpp)
    connect   host → member   epoch (every stage is loaded: open the ring edges now)
    ready     member → host   epoch, edge {predicted, actual, ready_ms|null, error|null, rtt_ms|null}|null
                              (its outgoing ring edge; null for a ring of one)
    admit     host → member   epoch
    reject    host → member   reason (the planner's text)
    refused   host → member   reason (this member cannot take part, e.g. a different llama.cpp build)
    measuring member → host   step, attempt, waiting, elapsed_s (how measuring its machine goes, at most 1/s;
                              waiting: for another Kafila process's measurement on the same machine)
    measured  member → host   measurements {...} (what an announcement carries, sent after "measuring")
    lost      any → host/all  who, reason, epoch
    replan    host → all      reason, epoch (the epoch ends, nobody lost: stop serving, await `assign`)
    stats     head → host     stages {name: {predicted_s, measured_s|null}}, network_share|null,
                              tokens_per_s|null, ttft {prompt_tokens, measured_s, predicted_s|null}|null (the
                              latest request's), circuit_gap_s|null (a decode circuit's time outside compute)
    free      ring            seq (drop that KV-cache sequence; travels the whole ring back to the head)
    trim      ring            seq, keep (drop its positions from keep on, so a new request reuses the rest;
                              travels the ring back to the head, ahead of the frames that rely on it)
    fork      ring            src, seq, keep (seq becomes src's positions before keep: a prompt another
                              request computed, as for n choices; travels the ring like trim)
    chat      ring / control  id, origin, body (an OpenAI chat request, optionally "resume": [token ids]
                              an earlier ring generated and "resume_cuts": [its prompt's chunks]),
                              forwarded to the head
    chat_evt  ring / control  id, dest, evt: {"delta": str, "tokens": [ids], "prompt_cuts"?: [n]} (the
                              chunks the prompt went round in, with the first token) | {"done": {...stats}} |
                              {"error": str, "resumable": bool} | {"notice": str} |
                              {"progress": {"prefilled": n, "prompt_tokens": n}} |
                              {"tool_format": dialect} (before the first delta of a chat with tools)
    roster    host → member   coordinator, model, members {name: {bw, disp, mem, ubw, nat, rtt_ms|null}},
                              beside|null (the ring member in the coordinator's own process; null: it
                              only coordinates), holders [names holding the verified model file],
                              model_sha256|null, fingerprints {name: sha256}, mandates {holder:
                              credential} (kafila.net.mandate): the coordinator's state at each admission,
                              all a member needs to take coordination over (kafila.session.member.takeover)
    bye       any             reason (closing on purpose; on a ring edge: the session cannot go on)
    copy      host → member   manifest {sha256, size, chunk_size, chunks} of the model file: a copy to keep
    copy_need member → host   chunks [at most COPY_BATCH indices it still lacks] (a batch at a time)
    copied    member → host   sha256|null (the verified copy), error|null (why it holds none)

decode() checks every field's type and range from one table (SCHEMA, its checks in fields.py); anything
malformed is a ProtocolError naming what is wrong, never another exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from kafila.errors import ProtocolError
from kafila.session.protocol.chunks import CHUNK_MAGIC, COPY_BATCH, COPY_MAGIC
from kafila.session.protocol.fields import (
    EPOCH,
    MAX_CONTROL,
    MAX_INDEX,
    NAME,
    NAMES,
    SECONDS,
    SHA256,
    TEXT,
    Check,
    block_range,
    boolean,
    chat_event,
    check_fields,
    integer,
    json_object,
    list_of,
    manifest,
    map_of,
    null_or,
    number,
    plan,
    record,
    session_settings,
)
from kafila.session.protocol.fields import MAX_NAME as MAX_NAME
from kafila.session.protocol.fields import MAX_TEXT as MAX_TEXT
from kafila.session.protocol.frames import MAGIC as FRAME_MAGIC
from kafila.session.protocol.manifest import StageManifest
from kafila.session.protocol.model_manifest import ModelSource
from kafila.session.protocol.records import EdgeOutcome as EdgeOutcome  # the records messages carry, read from here
from kafila.session.protocol.records import Measured as Measured
from kafila.session.protocol.records import StageTime as StageTime
from kafila.session.protocol.records import TtftTime as TtftTime
from kafila.session.settings import SessionSettings

# 2: fingerprints in assign and roster; prove/proof. 3: stats' circuit_gap_s; copy, copy_need, copied. 4: measuring,
# measured. 5: assign's settings (kafila.session.settings). 6: roster's mandates; stats and chat_evt from the head
# only. 7: settings' chat_template; chat_evt {"tool_format"}. 8: fork (n choices). 9: source(s), working's held
CONTROL_VERSION = 9

MEASURING_KEY = "measuring"  # announced (true) by a member whose measurements follow in a 'measured' message
DEFAULT_MAX_TOKENS = 256  # a chat request's max_tokens when it names none


def kind(msg: bytes) -> str:
    """'frame', 'chunk', 'copy' or 'control'."""
    if msg[:4] == FRAME_MAGIC:
        return "frame"
    if msg[:4] == CHUNK_MAGIC:
        return "chunk"
    if msg[:4] == COPY_MAGIC:
        return "copy"
    if msg[:1] == b"{":
        return "control"
    raise ProtocolError(f"unknown session message starting {msg[:4]!r}")


# -- the messages ---------------------------------------------------------------------------------
class Control:
    """A control message; T is its "t" on the wire."""

    T: ClassVar[str]


@dataclass(frozen=True, kw_only=True)  # by name: eleven fields in a row are easy to pass in the wrong order
class Assign(Control):
    T = "assign"
    epoch: int
    order: tuple[str, ...]
    head: str
    ranges: dict[str, tuple[int, int]]
    settings: SessionSettings  # the session's, as every coordinator runs it
    plan: dict[str, Any]
    model: str
    stage: StageManifest
    cut_local: bool = False
    # each ring member's certificate fingerprint (hex), as the coordinator admitted it: edges open to that
    # member, not to whoever announced the same name later
    fingerprints: dict[str, str] = field(default_factory=dict)
    source: ModelSource | None = None  # public URLs of the model for the stage's chunks (None: from the host)

    @property
    def config(self) -> dict[str, int]:
        """The llama.cpp context settings of every stage (n_ctx_per_seq, n_seq_max, n_batch)."""
        return self.settings.config

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
    held: int | None = None  # bytes of its stage it holds, when they come from elsewhere than the host


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
class Measuring(Control):
    T = "measuring"
    step: str
    attempt: int  # the probe's decode timing attempt (kafila.engine.probe.DECODE_ATTEMPTS in all); 0 before it
    waiting: bool  # for another Kafila process's measurement on the same machine (it holds the cores)
    elapsed_s: float  # since this member began measuring


@dataclass(frozen=True)
class MeasuredSelf(Control):
    T = "measured"
    measurements: dict[str, Any]


@dataclass(frozen=True)
class Lost(Control):
    T = "lost"
    who: str
    reason: str
    epoch: int


@dataclass(frozen=True)
class Replan(Control):
    T = "replan"
    reason: str
    epoch: int


@dataclass(frozen=True)
class Stats(Control):
    T = "stats"
    stages: dict[str, StageTime]
    network_share: float | None
    tokens_per_s: float | None
    ttft: TtftTime | None = None
    circuit_gap_s: float | None = None  # a decode circuit's median time outside compute (RingStats)


@dataclass(frozen=True)
class Copy(Control):
    T = "copy"
    manifest: StageManifest


@dataclass(frozen=True)
class CopyNeed(Control):
    T = "copy_need"
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class Copied(Control):
    T = "copied"
    sha256: str | None
    error: str | None


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
class Fork(Control):
    T = "fork"
    src: int
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
class Prove(Control):
    """The coordinator asks a member that announced the host's model hash to prove it holds the file."""

    T = "prove"
    nonce: str  # hex: which bytes of the file to read (kafila.session.delivery.local_model.model_proof)


@dataclass(frozen=True)
class Proof(Control):
    T = "proof"
    digest: str  # the SHA-256 (hex) of the nonce and those bytes


@dataclass(frozen=True)
class Roster(Control):
    T = "roster"
    coordinator: str
    model: str
    members: dict[str, Measured]
    beside: str | None = None
    holders: tuple[str, ...] = ()
    model_sha256: str | None = None
    fingerprints: dict[str, str] = field(default_factory=dict)  # each member's, as admitted: the heir is found by it
    mandates: dict[str, dict[str, Any]] = field(default_factory=dict)  # holder → the credential it would announce


# the nested objects, each decoded into its dataclass above
_EDGE = record(EdgeOutcome, {"predicted": NAME, "actual": NAME, "ready_ms": null_or(SECONDS),
                             "error": null_or(TEXT), "rtt_ms": null_or(SECONDS)})
_MEASURED = record(Measured, {"bw": number(0.0, 1e15), "disp": SECONDS, "mem": integer(0, 1 << 60),
                             "ubw": number(0.0, 1e15), "nat": NAME, "rtt_ms": null_or(SECONDS)})
_STAGE_TIME = record(StageTime, {"predicted_s": SECONDS, "measured_s": null_or(SECONDS)})
_TTFT = record(TtftTime, {"prompt_tokens": integer(0, MAX_INDEX), "measured_s": SECONDS,
                          "predicted_s": null_or(SECONDS)})

# The one decode table: each type's class and a check per field.
SCHEMA: dict[str, tuple[type[Control], dict[str, Check]]] = {
    "assign": (Assign, {"epoch": EPOCH, "order": NAMES, "head": NAME, "ranges": map_of(block_range),
                        "settings": session_settings, "plan": plan, "model": TEXT, "stage": manifest,
                        "cut_local": boolean, "fingerprints": map_of(SHA256),
                        "source": null_or(lambda v, where: ModelSource.from_dict(v))}),
    "need": (Need, {"epoch": EPOCH, "chunks": list_of(integer(0, MAX_INDEX))}),
    "working": (Working, {"epoch": EPOCH, "step": NAME, "held": null_or(integer(0, 1 << 50))}),
    "loaded": (Loaded, {"epoch": EPOCH}),
    "connect": (Connect, {"epoch": EPOCH}),
    "ready": (Ready, {"epoch": EPOCH, "edge": null_or(_EDGE)}),
    "admit": (Admit, {"epoch": EPOCH}),
    "reject": (Reject, {"reason": TEXT}),
    "refused": (Refused, {"reason": TEXT}),
    "measuring": (Measuring, {"step": TEXT, "attempt": integer(0, 1000), "waiting": boolean,
                              "elapsed_s": SECONDS}),
    "measured": (MeasuredSelf, {"measurements": json_object}),
    "lost": (Lost, {"who": NAME, "reason": TEXT, "epoch": EPOCH}),
    "replan": (Replan, {"reason": TEXT, "epoch": EPOCH}),
    "stats": (Stats, {"stages": map_of(_STAGE_TIME), "network_share": null_or(number(0.0, 1.0)),
                      "tokens_per_s": null_or(number(0.0, 1e9)), "ttft": null_or(_TTFT),
                      "circuit_gap_s": null_or(SECONDS)}),
    "copy": (Copy, {"manifest": manifest}),
    "copy_need": (CopyNeed, {"chunks": list_of(integer(0, MAX_INDEX), COPY_BATCH)}),
    "copied": (Copied, {"sha256": null_or(SHA256), "error": null_or(TEXT)}),
    "free": (Free, {"seq": integer(0, 0xFFFF)}),
    "trim": (Trim, {"seq": integer(0, 0xFFFF), "keep": integer(0, MAX_INDEX)}),
    "fork": (Fork, {"src": integer(0, 0xFFFF), "seq": integer(0, 0xFFFF), "keep": integer(0, MAX_INDEX)}),
    "chat": (Chat, {"id": NAME, "origin": NAME, "body": json_object}),
    "chat_evt": (ChatEvt, {"id": NAME, "dest": NAME, "evt": chat_event}),
    "bye": (Bye, {"reason": TEXT}),
    "prove": (Prove, {"nonce": SHA256}),
    "proof": (Proof, {"digest": SHA256}),
    "roster": (Roster, {"coordinator": NAME, "model": TEXT, "members": map_of(_MEASURED),
                        "beside": null_or(NAME), "holders": NAMES, "model_sha256": null_or(SHA256),
                        "fingerprints": map_of(SHA256), "mandates": map_of(json_object)}),
}


def _assign_consistent(msg: Assign) -> None:
    if len(set(msg.order)) != len(msg.order) or not msg.order or msg.head != msg.order[0]:
        raise ProtocolError("'assign': the order must name each member once, the head first")
    if set(msg.ranges) != set(msg.order):
        raise ProtocolError("'assign': every member of the order needs a block range, and only they")
    if set(msg.fingerprints) != set(msg.order):
        raise ProtocolError("'assign': every member of the order needs its certificate fingerprint, and only they")


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
    msg = cls(**check_fields(obj, checks, f"'{t}' message"))
    if isinstance(msg, Assign):
        _assign_consistent(msg)
    return msg


def _plain(v: Any) -> Any:
    """A message field as JSON data."""
    if isinstance(v, StageManifest | SessionSettings | ModelSource):
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


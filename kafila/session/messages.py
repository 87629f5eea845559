"""Session messages carried over links (kafila.net Link: whole messages, in order, encrypted).

Three kinds, told apart by their first bytes:

    b"KFA1" ...   activation frame (kafila.net.frames): hidden-state rows moving around the ring
    b"KFC1" ...   stage chunk: u32 index | raw bytes of one chunk of a stage file (host → member)
    b"{" ...      a control message: one UTF-8 JSON object with a "t" (type) field, below

Control types (host ⇄ member on the control link; ring messages on ring links):

    assign     host → member   epoch, order [names], head, ranges, config, plan, stage {sha256, size,
                               chunk_size, chunks [sha256 per chunk]}, api_port
    need       member → host   epoch, chunks [indices the member still lacks] (empty: it has the stage)
    loaded     member → host   epoch (stage received, verified and loaded into llama.cpp)
    connect    host → member   epoch (every stage is loaded: open the ring edges now)
    ready      member → host   epoch, edge {predicted, actual, ready_ms} (its outgoing ring edge)
    admit      host → member   epoch
    reject     host → member   reason (the planner's text)
    refused    host → member   reason (this member cannot take part, e.g. a different llama.cpp build)
    lost       any → host/all  who, reason, epoch
    stats      head → host     stages {name: [predicted_s, measured_s]}, network_share, tokens_per_s
    free       ring            seq (drop that KV-cache sequence; travels the whole ring back to the head)
    chat       ring / control  id, origin, body (an OpenAI chat request, optionally "resume": [token ids]
                               an earlier ring generated), forwarded to the head
    chat_evt   ring / control  id, dest, evt ({"delta": str, "tokens": [ids]} | {"done": {...stats}} |
                               {"error": str, "resumable": bool})
    bye        any             reason (closing on purpose)

Every decoder checks types and sizes; malformed input is a ProtocolError naming what is wrong.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from kafila.errors import ProtocolError

DEFAULT_MAX_TOKENS = 256  # a chat request's max_tokens when it names none
FRAME_MAGIC = b"KFA1"
CHUNK_MAGIC = b"KFC1"
CONTROL_TYPES = frozenset(
    {"assign", "need", "loaded", "connect", "ready", "admit", "reject", "refused", "lost", "stats", "free", "chat",
     "chat_evt", "bye"}
)
MAX_CONTROL = 4 * 1024 * 1024


def kind(msg: bytes) -> str:
    """'frame', 'chunk' or 'control'."""
    if msg[:4] == FRAME_MAGIC:
        return "frame"
    if msg[:4] == CHUNK_MAGIC:
        return "chunk"
    if msg[:1] == b"{":
        return "control"
    raise ProtocolError(f"unknown session message starting {msg[:4]!r}")


def control(t: str, **fields: Any) -> bytes:
    """Encode a control message of type `t`."""
    assert t in CONTROL_TYPES, t
    return json.dumps({"t": t, **fields}, separators=(",", ":")).encode()


def parse_control(msg: bytes) -> dict[str, Any]:
    """Decode a control message; ProtocolError unless it is a JSON object of a known type."""
    if len(msg) > MAX_CONTROL:
        raise ProtocolError(f"control message of {len(msg)} bytes exceeds {MAX_CONTROL}")
    try:
        obj = json.loads(msg)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"control message is not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("t") not in CONTROL_TYPES:
        raise ProtocolError(f"control message has no known type: {str(obj)[:80]}")
    return obj


def field(msg: dict[str, Any], name: str, kind_: type | tuple[type, ...]) -> Any:
    """A required field of a given type, or a ProtocolError naming it."""
    value = msg.get(name)
    if not isinstance(value, kind_) or (isinstance(value, bool) and kind_ in (int, float)):
        raise ProtocolError(f"'{msg.get('t')}' message: field '{name}' is missing or not {kind_}")
    return value


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

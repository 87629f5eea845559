"""The checks the control-message table (kafila.session.protocol.messages.SCHEMA) holds each field to.

A check takes (value, where) and returns the decoded value, or raises ProtocolError naming `where`
and what it must be; the combinators build the table's nested checks from these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kafila.engine.chat.formats import FORMATS
from kafila.errors import ProtocolError
from kafila.session.protocol.manifest import StageManifest
from kafila.session.protocol.model_manifest import MAX_URL, MAX_URLS, check_url
from kafila.session.settings import SessionSettings

MAX_CONTROL = 4 * 1024 * 1024
MAX_NAME = 255
MAX_TEXT = 64 * 1024
MAX_CHAT_TEMPLATE = 256 * 1024  # characters of a --chat-template (commands/_common.py refuses a longer one)
MAX_INDEX = (1 << 31) - 1
SPECULATION_MODES = ("auto", "lookup", "draft", "off")  # the head's (session/ring/speculation.py)

Check = Callable[[Any, str], Any]


def integer(lo: int, hi: int) -> Check:
    """An integer (never a bool) in [lo, hi]."""
    def check(v: Any, where: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ProtocolError(f"{where} must be an integer in [{lo}, {hi}]")
        return v
    return check


def number(lo: float, hi: float) -> Check:
    """A finite number in [lo, hi], as a float."""
    def check(v: Any, where: str) -> float:
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
            raise ProtocolError(f"{where} must be a number in [{lo:g}, {hi:g}]")
        return float(v)
    return check


def string(max_len: int, min_len: int = 0) -> Check:
    """A string of min_len to max_len characters."""
    def check(v: Any, where: str) -> str:
        if not isinstance(v, str) or not min_len <= len(v) <= max_len:
            raise ProtocolError(f"{where} must be a string of {min_len} to {max_len} characters")
        return v
    return check


def one_of(*choices: str) -> Check:
    """One of the given strings."""
    def check(v: Any, where: str) -> str:
        if v not in choices or not isinstance(v, str):
            raise ProtocolError(f"{where} must be one of {', '.join(choices)}")
        return v
    return check


def boolean(v: Any, where: str) -> bool:
    """True or false."""
    if not isinstance(v, bool):
        raise ProtocolError(f"{where} must be true or false")
    return v


def null_or(inner: Check) -> Check:
    """Null, or what `inner` accepts."""
    def check(v: Any, where: str) -> Any:
        return None if v is None else inner(v, where)
    return check


def list_of(item: Check, max_len: int | None = None) -> Check:
    """A list (of at most max_len items) whose every item `item` accepts, as a tuple."""
    def check(v: Any, where: str) -> tuple[Any, ...]:
        if not isinstance(v, list) or (max_len is not None and len(v) > max_len):
            raise ProtocolError(f"{where} must be a list" + (f" of at most {max_len} items" if max_len else ""))
        return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))
    return check


def map_of(value: Check) -> Check:
    """An object keyed by names whose every value `value` accepts."""
    def check(v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ProtocolError(f"{where} must be an object")
        return {NAME(k, f"a key of {where}"): value(x, f"{where}[{k!r}]") for k, x in v.items()}
    return check


def json_object(v: Any, where: str) -> dict[str, Any]:
    """Any JSON object, as it is."""
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object")
    return v


def record(cls: type, checks: dict[str, Check]) -> Check:
    """A nested object decoded into the dataclass `cls`."""
    def check(v: Any, where: str) -> Any:
        return cls(**check_fields(json_object(v, where), checks, where))
    return check


def check_fields(obj: dict[str, Any], checks: dict[str, Check], where: str) -> dict[str, Any]:
    """Every field `checks` names, each through its check; a missing one is a ProtocolError."""
    missing = [name for name in checks if name not in obj]
    if missing:
        raise ProtocolError(f"{where}: missing field {', '.join(missing)}")
    return {name: check(obj[name], f"{where}: {name}") for name, check in checks.items()}


NAME = string(MAX_NAME, 1)
NAMES = list_of(NAME, 64)
EPOCH = integer(0, MAX_INDEX)
TEXT = string(MAX_TEXT)
SECONDS = number(0.0, 1e9)
SHA256 = string(64, 64)


def block_range(v: Any, where: str) -> tuple[int, int]:
    """A block range [start, end) with start < end."""
    if not isinstance(v, list) or len(v) != 2:
        raise ProtocolError(f"{where} must be a block range [start, end)")
    start, end = (integer(0, MAX_INDEX)(x, where) for x in v)
    if not start < end:
        raise ProtocolError(f"{where} must be a block range [start, end) with start < end")
    return start, end


def session_settings(v: Any, where: str) -> SessionSettings:
    """An assignment's SessionSettings: every field, each checked (the context sizes positive integers)."""
    size = integer(1, 1 << 24)
    return record(SessionSettings, {
        "context": size, "concurrency": size, "batch": size, "speculate": one_of(*SPECULATION_MODES),
        "replan": boolean, "copy": boolean, "stall_s": SECONDS, "measure_wait_s": SECONDS, "mixed_builds": boolean,
        "strategy": NAME, "chat_template": null_or(string(MAX_CHAT_TEMPLATE)), "sources": _urls})(v, where)


def _urls(v: Any, where: str) -> tuple[str, ...]:
    return tuple(check_url(u) for u in list_of(string(MAX_URL, 1), MAX_URLS)(v, where))


def plan(v: Any, where: str) -> dict[str, Any]:
    """The planner's JSON, whose "stage_seconds" (the only part read) must be seconds per name."""
    obj = json_object(v, where)
    map_of(SECONDS)(obj.get("stage_seconds", {}), f"{where}.stage_seconds")
    return obj


def manifest(v: Any, where: str) -> StageManifest:
    """A stage manifest, its fields' types checked before its own consistency."""
    obj = json_object(v, where)
    # the types first, so that the manifest's own consistency check sees only sane numbers
    SHA256(obj.get("sha256"), f"{where}.sha256")
    integer(0, 1 << 50)(obj.get("size"), f"{where}.size")
    integer(1, 1 << 32)(obj.get("chunk_size"), f"{where}.chunk_size")
    list_of(SHA256)(obj.get("chunks"), f"{where}.chunks")
    return StageManifest.from_dict(obj)


def chat_event(v: Any, where: str) -> dict[str, Any]:
    """A chat_evt's event: one of delta, done, error, notice, progress, tool_format."""
    obj = json_object(v, where)
    if "delta" in obj:
        string(MAX_CONTROL)(obj["delta"], f"{where}.delta")
        list_of(integer(0, MAX_INDEX))(obj.get("tokens"), f"{where}.tokens")
        if "prompt_cuts" in obj:
            list_of(integer(1, MAX_INDEX))(obj["prompt_cuts"], f"{where}.prompt_cuts")
    elif "done" in obj:
        json_object(obj["done"], f"{where}.done")
    elif "error" in obj or "notice" in obj:
        TEXT(obj.get("error", obj.get("notice")), f"{where}'s text")
    elif "progress" in obj:
        progress = json_object(obj["progress"], f"{where}.progress")
        for name in ("prefilled", "prompt_tokens"):
            integer(0, MAX_INDEX)(progress.get(name), f"{where}.progress.{name}")
    elif "tool_format" in obj:
        one_of(*FORMATS)(obj["tool_format"], f"{where}.tool_format")
    else:
        raise ProtocolError(f"{where} must carry one of delta, done, error, notice, progress, tool_format")
    return obj

"""A chat's messages and tools, validated: what the template will render and what the reply may call.

Messages follow OpenAI's chat completions: `system` (or `developer`), `user`, `assistant` (its text,
or `tool_calls` with the content null) and `tool` (a call's result, naming the call by
`tool_call_id`). Tools are functions with a name, a description and JSON-schema parameters;
`tool_choice` is `none`, `auto`, `required` or one named function, and `parallel_tool_calls` lets a
reply hold several calls (off unless asked for, as in llama.cpp's server). Every bad part is a
BadRequest naming it (`messages[2].tool_calls[0].function.name`, `tools[1].function.parameters`...).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kafila.engine.chat.grammar import schema_problem
from kafila.errors import SessionError
from kafila.session.ring.structured import FieldError, request_grammar

MAX_MESSAGES = 1024
# The whole body travels the ring as one control message (messages.MAX_CONTROL, 4 MiB): JSON may
# write a character as 12 bytes (an escaped astral character), so 256 Ki characters always fit.
MAX_CONTENT_CHARS = 256 * 1024
MAX_TOOLS = 128  # OpenAI's limit
MAX_CALLS = 128  # calls in one assistant message
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CHOICES = ("none", "auto", "required")


class BadRequest(SessionError):
    """A chat body the ring will not run; `param` names the field (OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code

    def event(self) -> dict[str, Any]:
        """As a head's error event: answered with HTTP 400, never resumed."""
        return {"error": str(self), "status": 400, "param": self.param, "code": self.code}


@dataclass(frozen=True)
class ToolCall:
    """A call an assistant message made: its id, the function's name and its arguments (a JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: str  # system, user, assistant or tool
    content: str | None  # None: an assistant message that only calls tools
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # a tool message's: the call it answers
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's shape, keys in the order llama.cpp hands a template them (common_chat_msgs_to_json_oaicompat)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments},
                                  "id": c.id} for c in self.tool_calls]
        return out

    @property
    def size(self) -> int:
        """Characters it holds (bounded by MAX_CONTENT_CHARS over a chat)."""
        return len(self.content or "") + sum(len(c.name) + len(c.arguments) + len(c.id) for c in self.tool_calls)


@dataclass(frozen=True)
class Tool:
    """A function the reply may call; `parameters` is its JSON schema, as JSON text (kept exactly)."""

    name: str
    description: str
    parameters: str

    def as_dict(self) -> dict[str, Any]:
        """As llama.cpp hands a template a tool (common_chat_tools_to_json_oaicompat)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                  "parameters": json.loads(self.parameters)}}


def messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects", "messages",
                         "invalid_type")
    if len(value) > MAX_MESSAGES:
        raise BadRequest(f"'messages' holds {len(value)} messages; at most {MAX_MESSAGES} are accepted", "messages")
    out, total = [], 0
    for i, m in enumerate(value):
        message = _message(m, f"messages[{i}]")
        total += message.size
        if total > MAX_CONTENT_CHARS:
            raise BadRequest(f"the messages hold more than {MAX_CONTENT_CHARS} characters", "messages",
                             "context_length_exceeded")
        out.append(message)
    return tuple(out)


def _message(m: Any, where: str) -> Message:
    if not isinstance(m, dict):
        raise BadRequest(f"'{where}' must be an object with 'role' and 'content'", where, "invalid_type")
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise BadRequest(f"'{where}.role' must be one of {', '.join(ROLES)}, got {shown(role)}", f"{where}.role")
    role = ROLES[role]
    # a tool result's function name goes to the template; other messages' `name` is dropped, as it always was
    name = _text(m.get("name"), f"{where}.name", optional=True) if role == "tool" else None
    calls = _calls(m.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ()
    if role != "assistant" and m.get("tool_calls") is not None:
        raise BadRequest(f"'{where}.tool_calls' is for assistant messages only", f"{where}.tool_calls")
    if calls and m.get("content") in (None, ""):
        content = None  # a message that only calls tools: null content, as OpenAI's clients send it back
    else:
        content = text_content(m.get("content"), f"{where}.content")
    call_id = None
    if role == "tool":
        call_id = _text(m.get("tool_call_id"), f"{where}.tool_call_id")
    return Message(role, content, calls, call_id, name)


def _calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CALLS:
        raise BadRequest(f"'{where}' must be a list of at most {MAX_CALLS} calls "
                         '({"id", "type": "function", "function": {"name", "arguments"}})', where, "invalid_type")
    out = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function" \
                or not isinstance(call.get("function"), dict):
            raise BadRequest(f"'{at}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                             f"\"arguments\"}}}}, got {shown(call)}", at, "invalid_type")
        function = call["function"]
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some clients send the object itself: kept as its JSON text
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append(ToolCall(_text(call.get("id"), f"{at}.id"), _text(function.get("name"), f"{at}.function.name"),
                            _text(arguments, f"{at}.function.arguments")))
    return tuple(out)


def _text(value: Any, where: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"'{where}' must be a string, got {shown(value)}", where, "invalid_type")
    return value


def text_content(value: Any, where: str) -> str:
    """A string, or OpenAI's list of text parts (joined); images and audio are refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
    ):
        return "\n".join(p["text"] for p in value)
    raise BadRequest(f"'{where}' must be a string or a list of text parts, got {shown(value)}", where,
                     "invalid_type")


def tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise BadRequest(f"'tools' must be a list of at most {MAX_TOOLS} functions "
                         '({"type": "function", "function": {"name", "description", "parameters"}})', "tools",
                         "invalid_type")
    out, names = [], set()
    for i, tool in enumerate(value):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise BadRequest(f"'{at}' must be {{\"type\": \"function\", \"function\": {{...}}}}, got {shown(tool)}",
                             at, "invalid_type")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise BadRequest(f"'{at}.function.name' must be 1 to 64 letters, digits, '_' or '-', got {shown(name)}",
                             f"{at}.function.name")
        if name in names:
            raise BadRequest(f"'{at}.function.name': two tools are named {name!r}", f"{at}.function.name")
        names.add(name)
        description = _text(function.get("description", ""), f"{at}.function.description")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise BadRequest(f"'{at}.function.parameters' must be a JSON schema object, got {shown(parameters)}",
                             f"{at}.function.parameters", "invalid_type")
        out.append(Tool(name, description, json.dumps(parameters, ensure_ascii=False)))
    return tuple(out)


def tool_choice(value: Any, available: tuple[Tool, ...]) -> tuple[str, str | None]:
    """("none" | "auto" | "required", None) or ("function", its name); the default is "auto"."""
    if value is None:
        return "auto", None
    if isinstance(value, str) and value in CHOICES:
        if value == "required" and not available:
            raise BadRequest("'tool_choice' is 'required' but the request has no 'tools'", "tool_choice")
        return value, None
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise BadRequest("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                         f"{{\"name\": ...}}}}, got {shown(value)}", "tool_choice", "invalid_type")
    if name not in {t.name for t in available}:
        raise BadRequest(f"'tool_choice' names {name!r}, which is not one of the request's tools", "tool_choice")
    return "function", name


def forced(available: tuple[Tool, ...], choice: str, name: str | None) -> tuple[Tool, ...]:
    """The tools a reply must call one of (none: it need not call any), each checked convertible to a grammar."""
    if choice not in ("required", "function"):
        return ()
    chosen = available if choice == "required" else tuple(t for t in available if t.name == name)
    for i, tool in enumerate(available):
        if tool not in chosen:
            continue
        where = f"tools[{i}].function.parameters"
        try:  # the grammar core's own checks: sizes and counts bounded before the converter expands them
            request_grammar({"json_schema": json.loads(tool.parameters)})
            problem = schema_problem(json.loads(tool.parameters))
        except FieldError as exc:
            problem = str(exc).replace("'json_schema'", "it")
        if problem is not None:
            raise BadRequest(f"'{where}' cannot be turned into a grammar: {problem}", where)
    return chosen


def shown(value: Any) -> str:
    """A short rendering of a bad value for the error message (never the whole of a large one)."""
    try:
        text = "null" if value is None else repr(value)
    except ValueError:  # an integer past Python's digit limit for printing
        text = f"a {type(value).__name__} too large to show"
    return text if len(text) <= 40 else text[:37] + "..."

"""A model's chat template, rendered as llama.cpp's `--jinja` renders it (minja's `chat_template`).

Jinja2 runs the template with what minja gives it: `messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, `tools` (when there are any), `strftime_now`, `raise_exception`, and a `tojson` that writes
JSON as minja does (keys in their order, `", "` and `": "`, text unescaped). Before rendering, the
template is probed with dummy conversations, as minja probes it, to learn what it can show (a system
role, tools, tool calls, tool results, arguments as objects); what it cannot show is "polyfilled" the
same way: tools described in the system prompt with an example call, calls written as JSON content,
results as user messages, a system message folded into the next user one. The test data under
tests/engine/chat_templates holds what llama.cpp's own engine renders for real templates.
"""

from __future__ import annotations

import copy
import datetime
import json
from dataclasses import dataclass
from typing import Any

from jinja2 import Undefined
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

Json = Any  # a JSON value as json.loads gives it


def dump(value: Json, indent: int | None = None) -> str:
    """JSON as minja's `tojson` writes it: Python's spacing, keys in order, non-ASCII text as it is."""
    out: list[str] = []
    _dump(value, -1 if indent is None else indent, 0, out)
    return "".join(out)


def _dump(value: Json, indent: int, level: int, out: list[str]) -> None:
    def newline(depth: int) -> None:
        if indent > 0:
            out.append("\n" + " " * (depth * indent))

    if isinstance(value, dict | list):  # minja opens a line even for an empty one (`[\n  \n]`)
        items = list(value.items()) if isinstance(value, dict) else list(value)
        out.append("{" if isinstance(value, dict) else "[")
        newline(level + 1)
        for i, item in enumerate(items):
            if i:
                out.append(", " if indent < 0 else ",")
                if indent >= 0:
                    newline(level + 1)
            if isinstance(value, dict):
                out.append(json.dumps(str(item[0]), ensure_ascii=False) + ": ")
                item = item[1]
            _dump(item, indent, level + 1, out)
        newline(level)
        out.append("}" if isinstance(value, dict) else "]")
    else:
        out.append(json.dumps(value, ensure_ascii=False))


@dataclass(frozen=True)
class Caps:
    """What a template shows of a conversation, learnt by rendering dummy ones (minja's chat_template_caps)."""

    system_role: bool = False
    tools: bool = False
    tool_calls: bool = False
    tool_responses: bool = False
    parallel_tool_calls: bool = False
    object_arguments: bool = False  # shows a call's arguments only as an object (Llama 3.1), not as a string


class TemplateError(ValueError):
    """The template refused to render this conversation (its raise_exception, or a Jinja error)."""


def _trim(value: Any, chars: str | None = None) -> str:
    """Jinja's `trim`, except that nothing (an absent field, None) is "None", as minja writes it."""
    return "None" if value is None or isinstance(value, Undefined) else str(value).strip(chars)


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """One chat template: `apply` renders a conversation with tools as llama.cpp does."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda value, indent=None, **_: dump(value, indent)
        env.filters["trim"] = _trim
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self.caps = self._probe()
        self.tool_call_example = self._example() if not self.caps.tools else ""

    def render(self, messages: list[Json], tools: list[Json] | None = None, add_generation_prompt: bool = True,
               extra: dict[str, Json] | None = None) -> str:
        """The template itself, no polyfills; TemplateError when it refuses."""
        context: dict[str, Json] = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                                    "bos_token": self.bos_token, "eos_token": self.eos_token}
        if tools is not None:
            context["tools"] = tools
        # minja holds a null as undefined (`is defined` is false): a None is left out, not passed as None
        context |= {k: v for k, v in (extra or {}).items() if v is not None}
        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except Exception as exc:  # a template's own mistake or a conversation it cannot show
            raise TemplateError(f"{type(exc).__name__}: {exc}") from None

    def _try(self, messages: list[Json], tools: list[Json] | None = None) -> str:
        try:
            return self.render(messages, tools, add_generation_prompt=False)
        except TemplateError:
            return ""

    def _probe(self) -> Caps:
        user = {"role": "user", "content": "<User Needle>"}
        system = {"role": "system", "content": "<System Needle>"}
        tool = {"name": "some_tool", "type": "function", "function": {
            "name": "some_tool", "description": "Some tool.", "parameters": {
                "type": "object", "properties": {"arg": {"type": "string", "description": "Some argument."}},
                "required": ["arg"]}}}
        args = {"argument_needle": "print('Hello, World!')"}

        def calls(*tool_calls: Json) -> Json:
            return {"role": "assistant", "content": None, "tool_calls": list(tool_calls)}

        def call(name: str, arguments: Json) -> Json:
            return {"id": "call_1___", "type": "function", "function": {"arguments": arguments, "name": name}}

        def shows_args(out: str) -> bool:
            return '"argument_needle":' in out or "'argument_needle':" in out

        as_str = shows_args(self._try([user, calls(call("ipython", dump(args)))]))
        as_obj = shows_args(self._try([user, calls(call("ipython", args))]))
        caps = Caps(system_role="<System Needle>" in self._try([system, user]),
                    tools="some_tool" in self._try([user], [tool]),
                    tool_calls=as_str or as_obj, object_arguments=as_obj and not as_str)
        if not caps.tool_calls:
            return caps
        dummy = args if caps.object_arguments else dump(args)
        first, second = call("test_tool1", dummy), call("test_tool2", dummy)
        out = self._try([user, calls(first, second)])
        parallel = "test_tool1" in out and "test_tool2" in out
        out = self._try([user, calls(first), {"role": "tool", "name": "test_tool1", "content": "Some response!",
                                              "tool_call_id": "call_911_"}])
        return Caps(caps.system_role, caps.tools, True, "Some response!" in out, parallel, caps.object_arguments)

    def _example(self) -> str:
        """How this template writes a call, for the tools' system prompt (minja's tool_call_example)."""
        user = {"role": "user", "content": "Hey"}
        args = {"arg1": "some_value"}
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1___", "type": "function",
                "function": {"name": "tool_name", "arguments": args if self.caps.object_arguments else dump(args)}}]}
        try:
            prefix = self.apply([user], add_generation_prompt=True)
            full = self.apply([user, call], add_generation_prompt=False)
        except TemplateError:
            return ""
        eos = self.eos_token
        last = full.rfind(eos)
        # Python's rfind of "" is len(full), C++'s is npos-free too: both find the end
        if last == len(prefix) - len(eos) or (full.endswith("\n") and last == len(full) - len(eos) - 1):
            full = full[:last]
        common = 0
        for i in range(min(len(prefix), len(full))):
            if prefix[i] != full[i]:
                break
            if prefix[i] == "<":  # do not take a leading "<" of where the two differ (minja's DeepSeek R1 note)
                continue
            common = i + 1
        example = full[common:]
        return example if "tool_name" in example or "some_value" in example else ""

    def apply(self, messages: list[Json], tools: list[Json] | None = None, add_generation_prompt: bool = True,
              extra: dict[str, Json] | None = None) -> str:
        """The conversation rendered with what the template cannot show polyfilled, as minja does."""
        has_tools = bool(tools)
        has_calls = any(m.get("tool_calls") is not None for m in messages)
        has_results = any(m.get("role") == "tool" for m in messages)
        caps = self.caps
        fill_system = not caps.system_role
        fill_tools = has_tools and not caps.tools
        fill_calls = has_calls and not caps.tool_calls
        fill_results = has_results and not caps.tool_responses
        object_args = has_calls and caps.object_arguments
        if not (fill_system or fill_tools or fill_calls or fill_results or object_args):
            return self.render(messages, tools, add_generation_prompt, extra)
        if fill_tools:
            example = (f"\n\nExample tool call syntax:\n\n{self.tool_call_example}\n\n"
                       if self.tool_call_example else "")
            messages = add_system(messages, "You can call any of the following tools to satisfy the user's "
                                            f"requests: {dump(tools, 2)}{example}")
        out: list[Json] = []
        pending = ""
        for message in copy.deepcopy(messages):
            role = message["role"]
            if message.get("tool_calls") is not None and (object_args or fill_calls):
                for call in message["tool_calls"]:
                    _arguments_as_object(call)
                if fill_calls:
                    message["content"] = _calls_as_content(message)
                    del message["tool_calls"]
            if fill_results and role == "tool":
                message["role"] = "user"
                response = {"content": message["content"]}
                response |= {k: message[k] for k in ("name", "tool_call_id") if k in message}
                message["content"] = dump({"tool_response": response}, 2)
                message.pop("name", None)
            if message.get("content") is not None and fill_system:
                content = message["content"]
                if role == "system":
                    pending += ("\n" if pending else "") + content
                    continue
                if role == "user" and pending:
                    message["content"] = pending + ("\n" + content if content else "")
                    pending = ""
                elif role != "user" and pending:
                    out.append({"role": "user", "content": pending})
                    pending = ""
            out.append(message)
        if pending:
            out.append({"role": "user", "content": pending})
        return self.render(out, tools, add_generation_prompt, extra)


def _arguments_as_object(call: Json) -> None:
    function = call.get("function") if call.get("type") == "function" else None
    if function is not None and isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # left as the string it is, as minja leaves it


def _calls_as_content(message: Json) -> str:
    calls = []
    for call in message["tool_calls"]:
        if call.get("type") != "function":
            continue
        entry = {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        if "id" in call:
            entry["id"] = call["id"]
        calls.append(entry)
    obj: dict[str, Json] = {"tool_calls": calls}
    if message.get("content") not in (None, ""):
        obj["content"] = message["content"]
    return dump(obj, 2)


def add_system(messages: list[Json], prompt: str) -> list[Json]:
    """`prompt` appended to the conversation's system message, or as a new first one (minja's add_system)."""
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{prompt}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]

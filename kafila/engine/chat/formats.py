"""Which tool-call dialect a template speaks, and the prompt llama.cpp renders for it (common/chat.cpp).

llama.cpp picks a handler by looking for the dialect's markers in the template's source: Hermes 2 Pro
and Qwen 2.5/3 (`<tool_call>`), Llama 3.1+ (an `ipython` turn), Mistral Nemo (`[TOOL_CALLS]`), and for
a template that knows no tools the generic handler, which asks for JSON in a system prompt of its own.
A request without tools, or with `tool_choice: none`, is rendered as plain chat (its tools still
shown to a template that shows them). Templates of other dialects llama.cpp knows (DeepSeek R1,
Command R7B, Functionary, FireFunction) are served here by the generic handler.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafila.engine.chat.template import ChatTemplate, Json, add_system

CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL = (
    "content-only", "generic", "hermes", "llama3", "llama3-builtin", "mistral")
FORMATS = (CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL)
GENERIC_PROMPT = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
                  "reply to the user's request")
# Llama 3.1's built-in tools, called as `<|python_tag|>name.call(arg=...)`, and the one argument each takes
BUILTIN_TOOLS = {"wolfram_alpha": "query", "web_search": "query", "brave_search": "query", "python": "code",
                 "code_interpreter": "code"}


@dataclass(frozen=True)
class Prompt:
    """A rendered chat: llama.cpp's prompt text, whether it began with the BOS token (taken off, as
    llama.cpp takes it off before tokenising with BOS), and the dialect the reply's calls are read in."""

    text: str
    bos: bool
    format: str
    builtin_tools: tuple[str, ...] = ()


def choose(template: ChatTemplate, has_tools: bool, tool_choice: str) -> str:
    """The dialect llama.cpp's handler table picks for this template and request."""
    src = template.source
    if not has_tools or tool_choice == "none":
        return CONTENT_ONLY
    if "<tool_call>" in src:
        return HERMES
    if "<|start_header_id|>ipython<|end_header_id|>" in src and "<function=" not in src:
        return LLAMA_3_BUILTIN if "<|python_tag|>" in src else LLAMA_3
    if "[TOOL_CALLS]" in src:
        return MISTRAL
    return GENERIC


def builtin_tools(tools: list[Json]) -> tuple[str, ...]:
    """The tools Llama 3.1 calls with its own syntax: a built-in name whose one required argument is its own."""
    out = []
    for tool in tools:
        function = tool["function"]
        params = function.get("parameters") or {}
        arg = BUILTIN_TOOLS.get(function["name"])
        if arg is not None and isinstance(params, dict) and list(params.get("properties") or {}) == [arg] \
                and arg in (params.get("required") or []):
            out.append(function["name"])
    return tuple(out)


def render(template: ChatTemplate, messages: list[Json], tools: list[Json] | None, tool_choice: str = "auto",
           add_generation_prompt: bool = True) -> Prompt:
    """The prompt llama.cpp renders for `messages` (OpenAI's shape, as common_chat_msgs_to_json_oaicompat
    writes them) and `tools` (each {"type": "function", "function": {name, description, parameters}})."""
    fmt = choose(template, bool(tools), tool_choice)
    extra = None
    builtins: tuple[str, ...] = ()
    if fmt == GENERIC:
        messages = add_system(messages, GENERIC_PROMPT)
    elif fmt in (LLAMA_3, LLAMA_3_BUILTIN):
        builtins = builtin_tools(tools or []) if fmt == LLAMA_3_BUILTIN else ()
        fmt = LLAMA_3_BUILTIN if builtins else LLAMA_3
        extra = {"tools_in_user_message": False, "builtin_tools": list(builtins) or None}
    text = template.apply(messages, tools or None, add_generation_prompt, extra)
    bos = bool(template.bos_token) and text.startswith(template.bos_token)
    if bos:
        text = text[len(template.bos_token):]
    if template.eos_token and text.endswith(template.eos_token):
        text = text[:-len(template.eos_token)]
    return Prompt(text, bos, fmt, builtins)

"""What the head makes of a request before it runs: the prompt's tokens and, for a chat with tools, how
its reply's calls are written and read.

A completion's raw text is tokenised as llama.cpp's own completion does (BOS when the model adds one).
A chat goes through the model's chat template as llama.cpp's `--jinja` renders it
(engine/chat/formats.py), which also names the dialect the reply's calls come in; the markers of
that dialect that are special tokens (`<|python_tag|>`, `[TOOL_CALLS]`...) are shown in the reply's
text, so that the calls can be read from it. `tool_choice: required` or a named function gets the
grammar that makes the reply a call (engine/chat/grammar.py); so does the generic form with
`auto`, where llama.cpp's server asks for JSON (a call or a response) by grammar too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kafila.engine.chat.formats import CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL
from kafila.engine.chat.grammar import tool_grammar
from kafila.engine.chat.parse import PYTHON_TAG, TOOL_CALL, TOOL_CALL_END, TOOL_CALLS
from kafila.engine.vocab import Vocab
from kafila.session.ring.chat_messages import BadRequest, forced
from kafila.session.ring.chat_request import NO_CHAT_TEMPLATE, ChatRequest

MARKERS = {HERMES: (TOOL_CALL, TOOL_CALL_END), LLAMA_3: (PYTHON_TAG,), LLAMA_3_BUILTIN: (PYTHON_TAG,),
           MISTRAL: (TOOL_CALLS,)}


@dataclass(frozen=True)
class ChatPrompt:
    tokens: list[int]
    tool_format: str = CONTENT_ONLY  # the dialect the reply's calls are read in (content-only: none are)
    shown: frozenset[int] = frozenset()  # special tokens the reply's text shows
    grammar: str | None = None  # GBNF the reply must follow


def chat_prompt(chat: ChatRequest, vocab: Vocab) -> ChatPrompt:
    """The request's prompt; BadRequest when the model cannot take it."""
    if chat.prompt is not None:
        tokens = vocab.tokenize(chat.prompt, add_special=True, parse_special=True)
        if not tokens:
            raise BadRequest("'prompt' is empty (and this model adds no BOS token to start from)", "prompt")
        return ChatPrompt(tokens)
    if not vocab.chat_template:
        raise BadRequest("this model has no chat template (a base model): send its text to /v1/completions "
                         "instead", "messages", NO_CHAT_TEMPLATE)
    tools = [t.as_dict() for t in chat.tools] or None
    try:
        prompt = vocab.format_chat([m.as_dict() for m in chat.messages], tools, chat.tool_choice)
    except Exception as exc:  # the model's own template (jinja2) may refuse a conversation in its own way
        raise BadRequest(f"the model's chat template refused these messages: {exc}", "messages") from None
    fmt = prompt.format
    shown = frozenset(t for t in (vocab.single_token(m) for m in MARKERS.get(fmt, ())) if t is not None)
    return ChatPrompt(vocab.prompt_tokens(prompt), fmt, shown, _grammar(chat, fmt))


def _grammar(chat: ChatRequest, fmt: str) -> str | None:
    """A call forced by `tool_choice`, or the generic form's JSON (a call or a response) as llama.cpp asks it."""
    if fmt == CONTENT_ONLY:
        return None
    functions = [{"name": t.name, "parameters": json.loads(t.parameters)}
                 for t in forced(chat.tools, chat.tool_choice, chat.tool_name)]
    if functions:
        return tool_grammar(fmt, functions, chat.parallel_tool_calls)
    if fmt == GENERIC:
        every = [{"name": t.name, "parameters": json.loads(t.parameters)} for t in chat.tools]
        return tool_grammar(fmt, every, chat.parallel_tool_calls, response=True)
    return None


"""How the head turns a chat or completion body into the engine's Request: validated, tokenised, its sampler
seeded for its choice, its drafter chosen, and a resumed reply's tokens and chunks restored; for a chat with
tools, the dialect its reply's calls are written and read in.

A completion's raw text is tokenised as llama.cpp's own completion does (BOS when the model adds one).
A chat goes through the model's chat template as llama.cpp's `--jinja` renders it
(engine/chat/formats.py), which also names the dialect the reply's calls come in; the markers of
that dialect that are special tokens (`<|python_tag|>`, `[TOOL_CALLS]`...) are shown in the reply's
text, so that the calls can be read from it. `tool_choice: required` or a named function gets the
grammar that makes the reply a call (engine/chat/grammar.py); so does the generic form with
`auto`, where llama.cpp's server asks for JSON (a call or a response) by grammar too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from kafila.engine.chat.formats import CONTENT_ONLY, GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL
from kafila.engine.chat.grammar import tool_grammar
from kafila.engine.chat.parse import PYTHON_TAG, TOOL_CALL, TOOL_CALL_END, TOOL_CALLS
from kafila.engine.request import Request
from kafila.engine.stage import ContextConfig
from kafila.engine.vocab import TextStream, Vocab
from kafila.session.ring.chat_messages import forced
from kafila.session.ring.chat_request import NO_CHAT_TEMPLATE, BadRequest, ChatRequest, parse_request
from kafila.session.ring.speculation import Speculator

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


@dataclass
class RequestBuilder:
    """The head's model, context and speculation, as every request is built with them."""

    vocab: Vocab
    n_vocab: int
    config: ContextConfig
    speculator: Speculator

    def build(self, body: Any, slot: int = -1) -> tuple[Request, str]:
        """The engine's request for a chat or completion body and the dialect its reply's tool calls come in;
        BadRequest (never anything else) when it is bad."""
        chat = parse_request(body, internal=True)
        if chat.n > self.config.n_seq_max:
            raise BadRequest(f"'n' is {chat.n} but this session serves at most {self.config.n_seq_max} sequences at "
                             "once (its concurrency); ask for fewer choices (or the host raises --concurrency)", "n")
        for name, ids in (("resume", chat.resume), ("logit_bias", [t for t, _ in chat.logit_bias])):
            if any(t >= self.n_vocab for t in ids):
                raise BadRequest(f"'{name}' holds a token id outside the vocabulary", name)
        rendered = chat_prompt(chat, self.vocab)
        prompt = rendered.tokens
        if rendered.grammar is not None:  # a call the tool choice forces (_grammar)
            chat = dataclasses.replace(chat, grammar=rendered.grammar)
        n_ctx = self.config.n_ctx_per_seq
        field_name = "messages" if chat.prompt is None else "prompt"
        if len(prompt) + len(chat.resume) >= n_ctx:
            raise BadRequest(f"the prompt is {len(prompt) + len(chat.resume)} tokens but the context holds {n_ctx} "
                             "per request; shorten it (or the host raises --context)", field_name,
                             "context_length_exceeded")
        replay = self._replay(chat, len(prompt))
        sampler = chat.sampler(self.vocab, prompt)  # a resumed reply draws on from its next index
        # a rebuilt reply starts from nothing: a reused cache was computed in other chunks
        request = Request(slot, prompt + list(chat.resume), chat.max_tokens, n_ctx, sampler, self.vocab,
                          logprobs=chat.logprobs, stop=chat.stop, reuse_cache=chat.cache_prompt and not replay,
                          replay=replay, drafter=self.speculator.drafter(chat.speculate, sampler.params))
        request.text = TextStream(self.vocab, rendered.shown)  # a tool call's special markers show in its text
        for t in chat.resume:  # the text stream continues where the reply stopped (a character may span the cut)
            request.text.push(t)
        return request, rendered.tool_format

    def _replay(self, chat: ChatRequest, prompt_tokens: int) -> list[int]:
        """The chunks a resumed reply is rebuilt in: its prompt's as first computed, then a row per token.

        Nothing (a plain prefill, whose continuation may differ) when the recorded chunks do not cover this
        prompt, as when the first run reused a cached prefix."""
        cuts = list(chat.resume_cuts)
        if not chat.resume or sum(cuts) != prompt_tokens or not all(0 < c <= self.config.n_batch for c in cuts):
            return []
        return cuts + [1] * len(chat.resume)

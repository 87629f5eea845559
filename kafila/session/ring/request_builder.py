"""How the head turns a chat or completion body into the engine's Request: validated, tokenised, its sampler
seeded for its choice, its drafter chosen, and a resumed reply's tokens and chunks restored."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kafila.engine.request import Request
from kafila.engine.stage import ContextConfig
from kafila.engine.vocab import TextStream, Vocab
from kafila.session.ring.chat_prompt import chat_prompt
from kafila.session.ring.chat_request import BadRequest, ChatRequest, parse_request
from kafila.session.ring.speculation import Speculator


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
        if rendered.grammar is not None:  # a call the tool choice forces (chat_prompt.py)
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

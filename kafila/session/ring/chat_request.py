"""A chat or text-completion request body, validated: what the API accepts and what the head will run.

A chat (`/v1/chat/completions`) carries `messages`, which the head renders with the model's chat
template; a text completion (`/v1/completions`) carries a raw `prompt`, which the head tokenises as
llama.cpp's own completion does (BOS added when the model asks for it), so a base model without a
chat template can be used too. Both share the sampling fields and their limits.

The body is hostile input (DESIGN §5: any web page or local user can send one), so every field the
ring acts on is checked here for type, finiteness, range and size, once at the API and again at the
head, and a bad one becomes a `BadRequest` naming the field, which the API answers as a 400 in
OpenAI's error shape. The fields follow OpenAI's chat completions; `top_k` and `speculate` (this
request's speculation mode instead of the session's: auto, lookup, draft or off) are extensions, as are
llama-server's `grammar` and `json_schema` (structured.py turns them and `response_format` into the GBNF text of
`ChatRequest.grammar`, which the head's sampler follows), and
`resume` (token ids an earlier ring generated, see api.ApiServer.events), `resume_cuts` (the chunks
its prompt went round in) and `choice` (which of the request's `n` choices this one is: the API sends each
choice to the head as a request of its own) are only ever set by the API itself: a client's are dropped,
not trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kafila.engine.grammar import Grammar, GrammarError
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.vocab import Vocab
from kafila.session.protocol.fields import SPECULATION_MODES
from kafila.session.protocol.messages import DEFAULT_MAX_TOKENS
from kafila.session.ring import chat_messages
from kafila.session.ring.chat_messages import MAX_CONTENT_CHARS, BadRequest, Message, Tool
from kafila.session.ring.chat_messages import shown as _shown
from kafila.session.ring.structured import FieldError, request_grammar

DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.95
DEFAULT_TOP_K = 40
MAX_TOKENS_LIMIT = 1 << 20
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's (and llama-cpp-python's) default for a text completion
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_CHARS = 256
NO_CHAT_TEMPLATE = "no_chat_template"  # the error code of a chat sent to a model without a chat template
MAX_TOP_K = 1 << 20
# Fields OpenAI defines that Kafila cannot honour: refused rather than silently ignored.
UNSUPPORTED = ("functions", "function_call", "audio", "modalities", "prediction")
# ... unless they carry the value that asks for nothing (what many clients send by default).
NEUTRAL: dict[str, tuple[Any, ...]] = {"modalities": (["text"],)}
# The text-completion endpoint's own fields it cannot honour (`stop` it does honour).
COMPLETION_UNSUPPORTED = ("echo", "suffix", "best_of", "tools", "tool_choice", "functions")
MAX_TOP_LOGPROBS = 20  # OpenAI's limits: a chat's top_logprobs, a completion's logprobs
MAX_COMPLETION_LOGPROBS = 5
COMPLETION_NEUTRAL: dict[str, tuple[Any, ...]] = {"echo": (False,), "best_of": (1,), "tools": ([],)}
# OpenAI's own limit on a request's choices; the head refuses more than the session's slots (its concurrency)
MAX_N = 128
MAX_LOGIT_BIAS = 1024  # entries of a request's logit_bias
DEFAULT_REPEAT_LAST_N = 64  # llama.cpp's server's


@dataclass(frozen=True)
class ChatRequest:
    """A validated request: a chat's messages (and the tools its reply may call), or a completion's raw
    `prompt`, and sampling settings within their ranges."""

    messages: tuple[Message, ...] = ()
    prompt: str | None = None  # set: a text completion (no chat template); `messages` is then empty
    stop: tuple[str, ...] = ()  # the reply ends before the first of these (never part of the text)
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    resume: tuple[int, ...] = ()
    resume_cuts: tuple[int, ...] = ()  # the chunks the cut reply's prompt was computed in (Request.replay)
    cache_prompt: bool = True  # llama-server's field: false computes the whole prompt afresh (a reply as exact
    # as one context's, never reusing a cache an earlier request's batches computed)
    speculate: str | None = None  # None: the session's mode
    # What shapes the logits before sampling (kafila.engine.penalties): OpenAI's fields, llama.cpp's extensions
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # set: each token's log-probability and this many most likely alternatives
    grammar: str | None = None  # GBNF text the reply follows (grammar-constrained sampling at the head)
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # none, auto, required, or "function": the one named `tool_name`
    tool_name: str | None = None
    parallel_tool_calls: bool = False  # llama.cpp's server's default (OpenAI's is true)
    n: int = 1  # choices asked for: each its own KV sequence (slot) at the head, sharing the prompt's cache
    choice: int = 0  # which of them this request is (set by the API only): its own noise (sampler.py)

    def body(self) -> dict[str, Any]:
        """The normalised body sent toward the head (only the fields above, nothing a client added)."""
        out: dict[str, Any] = (
            {"prompt": self.prompt} if self.prompt is not None
            else {"messages": [m.as_dict() for m in self.messages]}
        )
        if self.tools:
            out["tools"] = [t.as_dict() for t in self.tools]
            out["tool_choice"] = (self.tool_choice if self.tool_name is None
                                  else {"type": "function", "function": {"name": self.tool_name}})
            out["parallel_tool_calls"] = self.parallel_tool_calls
        out |= {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed}
        if self.stop:
            out["stop"] = list(self.stop)
        if self.resume:
            out["resume"] = list(self.resume)
        if self.resume_cuts:
            out["resume_cuts"] = list(self.resume_cuts)
        if not self.cache_prompt:
            out["cache_prompt"] = False
        if self.speculate is not None:
            out["speculate"] = self.speculate
        for name in ("min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n"):
            if getattr(self, name) != getattr(ChatRequest, name):
                out[name] = getattr(self, name)
        if self.logit_bias:
            out["logit_bias"] = {str(t): b for t, b in self.logit_bias}
        if self.n != 1:
            out["n"] = self.n
        if self.choice:
            out["choice"] = self.choice
        if self.logprobs is not None:  # each endpoint's own way to ask
            out |= ({"logprobs": self.logprobs} if self.prompt is not None
                    else {"logprobs": True, "top_logprobs": self.logprobs})
        if self.grammar is not None:
            out["grammar"] = self.grammar
        return out

    def sampler(self, vocab: Vocab, prompt: list[int]) -> Sampler:
        """The head's sampler for this request, with its grammar compiled (a BadRequest when llama.cpp's parser
        refuses it) and advanced over a resumed reply's tokens."""
        try:
            grammar = None if self.grammar is None else Grammar(vocab, self.grammar)
        except GrammarError as exc:
            raise BadRequest(f"'grammar': {exc}", "grammar") from None
        try:
            return Sampler(self.sampling(), prompt, self.resume, grammar)
        except GrammarError as exc:
            raise BadRequest(f"'resume' does not follow the grammar: {exc}", "resume") from None

    def sampling(self) -> SamplingParams:
        """The sampler's settings; top_p 0 (allowed by OpenAI) keeps only the most likely token."""
        top_k, top_p = (1, 1.0) if self.top_p == 0.0 else (self.top_k, self.top_p)
        return SamplingParams(self.temperature, top_k, top_p, self.seed, self.choice, self.min_p,
                              self.presence_penalty, self.frequency_penalty, self.repeat_penalty, self.repeat_last_n,
                              self.logit_bias)

    def choices(self) -> list[dict[str, Any]]:
        """The body sent toward the head for each of the `n` choices (the API's fan-out): one request each."""
        body = self.body()
        return [body] if self.n == 1 else [{**body, "choice": i} for i in range(self.n)]


def parse_request(body: Any, *, internal: bool = False) -> ChatRequest:
    """A chat or a text completion, by its body (the head's way in): a body with `prompt` is a completion."""
    if isinstance(body, dict) and "prompt" in body:
        return parse_completion(body, internal=internal)
    return parse_chat(body, internal=internal)


def parse_chat(body: Any, *, internal: bool = False) -> ChatRequest:
    """Validate a chat body; BadRequest names the first bad field. `internal`: from our own API (resume kept)."""
    common = _common(body, UNSUPPORTED, NEUTRAL, DEFAULT_MAX_TOKENS, internal)
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, None)
    if top is not None and body.get("logprobs") is not True:
        raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if _optional(body, "logprobs", bool, False) else None
    tools = chat_messages.tools(body.get("tools"))
    choice, name = chat_messages.tool_choice(body.get("tool_choice"), tools)
    chat_messages.forced(tools, choice, name)  # a schema the grammar converter cannot take: refused here
    if tools and choice != "none" and common["grammar"] is not None:  # llama.cpp's server refuses it too
        raise BadRequest("a reply cannot follow both a grammar (grammar, json_schema, response_format) and "
                         "tools: send tool_choice 'none' or leave one of them out", "tools")
    return ChatRequest(messages=chat_messages.messages(body.get("messages")), stop=_stop(body.get("stop")),
                       logprobs=logprobs, tools=tools, tool_choice=choice, tool_name=name,
                       parallel_tool_calls=_optional(body, "parallel_tool_calls", bool, False), **common)


def parse_completion(body: Any, *, internal: bool = False) -> ChatRequest:
    """Validate a text-completion body (`/v1/completions`): a string `prompt`, optional `stop`, the sampling fields."""
    common = _common(body, COMPLETION_UNSUPPORTED, COMPLETION_NEUTRAL, DEFAULT_COMPLETION_TOKENS, internal)
    logprobs = _integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS, None)
    return ChatRequest(prompt=_prompt(body.get("prompt")), stop=_stop(body.get("stop")), logprobs=logprobs,
                       **common)


def _common(body: Any, unsupported: tuple[str, ...], neutral: dict[str, tuple[Any, ...]], default_tokens: int,
            internal: bool) -> dict[str, Any]:
    """The fields chats and completions share, validated, as ChatRequest's keyword arguments."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", None, "invalid_type")
    for name in unsupported:
        value = body.get(name)
        if value is not None and not any(_same(value, ok) for ok in neutral.get(name, ())):
            raise BadRequest(f"'{name}' is not supported by Kafila", name, "unsupported_parameter")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > 256):
        raise BadRequest("'model' must be a string of at most 256 characters", "model", "invalid_type")
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict)
                                    and isinstance(options.get("include_usage", False), bool)):
        raise BadRequest("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    limit = body.get("max_completion_tokens") if body.get("max_tokens") is None else body.get("max_tokens")
    param = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    seed = _integer({"seed": body.get("seed")}, "seed", -(1 << 63), (1 << 64) - 1, None)
    return {
        "max_tokens": _integer({param: limit}, param, 1, MAX_TOKENS_LIMIT, default_tokens),
        "temperature": _number(body, "temperature", 0.0, 2.0, DEFAULT_TEMPERATURE),
        "top_p": _number(body, "top_p", 0.0, 1.0, DEFAULT_TOP_P),
        "top_k": _integer(body, "top_k", 0, MAX_TOP_K, DEFAULT_TOP_K),
        "seed": None if seed is None else seed % (1 << 64),  # numpy's generators take non-negative seeds
        "stream": stream,
        "include_usage": bool(stream and options and options.get("include_usage")),
        "resume": _resume(body, "resume") if internal else (),
        "resume_cuts": _resume(body, "resume_cuts") if internal else (),
        "cache_prompt": _optional(body, "cache_prompt", bool, True),
        "speculate": _speculate(body),
        "min_p": _number(body, "min_p", 0.0, 1.0, 0.0),
        "presence_penalty": _number(body, "presence_penalty", -2.0, 2.0, 0.0),
        "frequency_penalty": _number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        "repeat_penalty": _number(body, "repeat_penalty", 0.01, 100.0, 1.0),
        # llama.cpp's -1: the whole context (no window is longer than the longest reply's prompt and reply)
        "repeat_last_n": _integer(body, "repeat_last_n", -1, MAX_TOKENS_LIMIT, DEFAULT_REPEAT_LAST_N) % (
            MAX_TOKENS_LIMIT + 1),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        "grammar": _grammar(body),
        "n": _integer(body, "n", 1, MAX_N, 1),
        "choice": _integer(body, "choice", 0, MAX_N - 1, 0) if internal else 0,
    }


def _grammar(body: dict[str, Any]) -> str | None:
    try:
        return request_grammar(body)
    except FieldError as exc:
        raise BadRequest(str(exc), exc.param) from None


def _speculate(body: dict[str, Any]) -> str | None:
    value = body.get("speculate")
    if value is not None and value not in SPECULATION_MODES:
        raise BadRequest(f"'speculate' must be one of {', '.join(SPECULATION_MODES)}, got {_shown(value)}",
                         "speculate")
    return value


def _same(value: Any, ok: Any) -> bool:
    return (type(value) is type(ok) and value == ok) or (isinstance(ok, int) and _is_number(value) and value == ok)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _optional(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise BadRequest(f"'{name}' must be a {kind.__name__}, got {_shown(value)}", name, "invalid_type")
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise BadRequest(f"'{name}' must be a number from {low:g} to {high:g}, got {_shown(value)}", name,
                         "invalid_type")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not (math.isfinite(number) and low <= number <= high):
        raise BadRequest(f"'{name}' must be a number from {low:g} to {high:g}, got {_shown(value)}", name)
    return number


def _integer(body: dict[str, Any], name: str, low: int, high: int, default: int | None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 100.0 from a client that writes every number as a float
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"'{name}' must be an integer from {low} to {high}, got {_shown(value)}", name,
                         "invalid_type")
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be an integer from {low} to {high}, got {_shown(value)}", name)
    return value


def _prompt(value: Any) -> str:
    """One string (OpenAI also takes lists of strings or of token ids: one completion per request here)."""
    if not isinstance(value, str):
        raise BadRequest(f"'prompt' must be a string, got {_shown(value)}", "prompt", "invalid_type")
    if len(value) > MAX_CONTENT_CHARS:
        raise BadRequest(f"the prompt holds {len(value)} characters; at most {MAX_CONTENT_CHARS} are accepted",
                         "prompt", "context_length_exceeded")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    """A string or a list of up to MAX_STOP non-empty strings."""
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return ()
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP
            and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):
        raise BadRequest(f"'stop' must be a string or a list of at most {MAX_STOP} strings, each of 1 to "
                         f"{MAX_STOP_CHARS} characters, got {_shown(value)}", "stop", "invalid_type")
    return tuple(stops)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token ids (as strings: JSON's keys) to a bias from -100 (a ban) to 100, as sorted pairs."""
    if value is None:
        return ()
    shape = (f"'logit_bias' must map at most {MAX_LOGIT_BIAS} token ids (\"123\") to numbers from -100 to 100, "
             f"got {_shown(value)}")
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise BadRequest(shape, "logit_bias", "invalid_type")
    out = {}
    for key, bias in value.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12:
            token = int(key)
        if token is None or token < 0 or not _is_number(bias) or not -100 <= bias <= 100:
            raise BadRequest(shape, "logit_bias")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


def _resume(body: dict[str, Any], name: str) -> tuple[int, ...]:
    """`resume` (token ids) or `resume_cuts` (chunk lengths): a list of integers >= 0, or nothing."""
    value = body.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOKENS_LIMIT or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise BadRequest(f"'{name}' must be a list of integers >= 0", name)
    return tuple(value)

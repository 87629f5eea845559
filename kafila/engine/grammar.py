"""Grammar-constrained sampling with llama.cpp's own grammar engine (GBNF), over the head's vocabulary.

How a caller asks for a grammar (structured output, a tool call that must be made):
- an API body carries `grammar` (GBNF text, llama-server's field), or `json_schema` / `response_format`, which
  chat_request.py converts with `schema_grammar` (llama-cpp-python's JSON-schema-to-GBNF converter);
- `ChatRequest.grammar` holds the GBNF text and travels to the head in the body (`"grammar": text`);
- the head compiles it, `Grammar(vocab, text)` (GrammarError, a 400, when llama.cpp's parser refuses it), and
  hands it to the request's `Sampler(params, prompt, reply, grammar=...)`, which advances it over a resumed
  reply's tokens, checks every token it samples (drafted ones included) and advances it with each one the
  reply takes.

It is as cheap as llama.cpp's common sampler: the token sampled without the grammar is tested alone, and
the whole vocabulary is constrained only when that token is refused; an end-of-generation token passes only
where the grammar is complete. A greedy reply is the one full constraint gives.
"""

from __future__ import annotations

import ctypes
import json
import weakref
from typing import Any

import numpy as np

from kafila.engine.llama_lib import llama
from kafila.errors import EngineError

ROOT = "root"
# llama-cpp-python's converter writes a string's character as `[^"\\]`, which lets a raw newline or tab into
# a JSON string (invalid JSON); llama.cpp's own converter (json-schema-to-grammar.cpp) excludes control
# characters, as JSON does: its rule replaces the port's
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'
# llama_token_data is {int32 id; float logit; float p}: a numpy record array of that layout is handed over as is
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarError(EngineError):
    """A grammar llama.cpp cannot compile, or a schema the converter cannot turn into one."""


def json_object_grammar() -> str:
    """llama.cpp's grammar for any JSON object (response_format {"type": "json_object"})."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return str(JSON_GBNF)


def schema_grammar(schema: Any) -> str:
    """The GBNF of a JSON schema (a dict) by llama-cpp-python's converter; GrammarError says what it refused."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema))).replace(_LOOSE_CHAR, _JSON_CHAR)
    except RecursionError:
        raise GrammarError("the schema nests too deeply") from None
    except Exception as exc:  # the converter asserts (and may fail otherwise) on what it does not handle
        raise GrammarError(f"the schema cannot be converted to a grammar: {exc or type(exc).__name__}") from None


class Grammar:
    """One reply's grammar state: which tokens may come next, advanced token by token.

    Owns a llama.cpp grammar sampler, freed with the object (or by `close`)."""

    def __init__(self, vocab: Any, gbnf: str, *, _sampler: Any = None) -> None:
        lc = llama()
        self.vocab, self.gbnf = vocab, gbnf
        sampler = _sampler if _sampler is not None else lc.llama_sampler_init_grammar(
            vocab.pointer, gbnf.encode("utf-8"), ROOT.encode())
        if not sampler:  # llama.cpp logs the parse error and returns NULL
            raise GrammarError("the grammar does not compile (llama.cpp's GBNF parser refused it, or it has a "
                               "left recursion or no 'root' rule)")
        self._sampler = sampler
        self._free = weakref.finalize(self, lc.llama_sampler_free, sampler)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._all: np.ndarray | None = None  # the whole vocabulary's rows, made on the first full constraint

    def close(self) -> None:
        """Free llama.cpp's sampler now (also done when the object is collected)."""
        self._free()

    def clone(self) -> Grammar:
        """An independent copy in the same state (another choice continuing the same text)."""
        return Grammar(self.vocab, self.gbnf, _sampler=llama().llama_sampler_clone(self._sampler))

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (an end-of-generation token: whether the grammar is complete)."""
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with -inf for every token that may not come next."""
        n = len(logits)
        if self._all is None or len(self._all) != n:
            self._all = np.zeros(n, dtype=_TOKEN_DATA)
        rows = self._all
        rows["id"], rows["logit"] = np.arange(n, dtype=np.int32), logits
        self._apply(rows)
        return np.where(np.isfinite(rows["logit"]), logits, -np.inf).astype(logits.dtype, copy=False)

    def accept(self, token: int) -> None:
        """Advance past `token`, which must be allowed (llama.cpp aborts the process on one that is not)."""
        if not self.allows(token):
            raise GrammarError(f"token {token} does not follow the grammar here")
        llama().llama_sampler_accept(self._sampler, token)

    def _apply(self, rows: np.ndarray) -> None:
        """llama.cpp's grammar sampler over `rows` (it only sets refused tokens' logits to -inf, in place)."""
        lc = llama()
        cur = lc.llama_token_data_array(rows.ctypes.data_as(lc.llama_token_data_p), len(rows), -1, False)
        lc.llama_sampler_apply(self._sampler, ctypes.byref(cur))

"""The head's tokenizer side: text to tokens as llama.cpp tokenises it, tokens back to text, chat template."""

from __future__ import annotations

import codecs
import ctypes
import functools
from collections.abc import Collection, Sequence
from typing import Any

from kafila.engine.chat.formats import Prompt, render
from kafila.engine.chat.template import ChatTemplate
from kafila.engine.llama_lib import llama
from kafila.errors import EngineError


class Vocab:
    """Tokenizer of a loaded model (the head's stage keeps the full vocabulary)."""

    def __init__(self, vocab_ptr: object, chat_template: str | None) -> None:
        lc = llama()
        self._vocab = vocab_ptr
        self.n_tokens = int(lc.llama_vocab_n_tokens(vocab_ptr))
        self.bos = int(lc.llama_vocab_bos(vocab_ptr))
        self.eos = int(lc.llama_vocab_eos(vocab_ptr))
        self.chat_template = chat_template

    @property
    def pointer(self) -> object:
        """llama.cpp's vocabulary (what its grammar sampler reads token pieces from)."""
        return self._vocab

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; the defaults are what llama.cpp's own completion uses for a prompt."""
        lc = llama()
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise EngineError("the prompt could not be tokenised")
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes one token stands for (special tokens render as nothing unless `special`)."""
        lc = llama()
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_end(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, end of turn...)."""
        return bool(llama().llama_vocab_is_eog(self._vocab, token))

    @functools.cached_property
    def template(self) -> ChatTemplate:
        """The model's chat template, as llama.cpp's `--jinja` renders it (probed once, on first use)."""
        if not self.chat_template:
            raise EngineError("this model has no chat template (a base model such as Gemma 3 270M); complete "
                              "raw text with `kafila generate --model MODEL PROMPT` instead")
        return ChatTemplate(self.chat_template, self.piece(self.bos, special=True).decode("utf-8", "replace"),
                            self.piece(self.eos, special=True).decode("utf-8", "replace"))

    def format_chat(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    tool_choice: str = "auto") -> Prompt:
        """The prompt the model's own chat template makes of `messages` (and `tools`), as llama.cpp's server
        renders it (chat/formats.py); TemplateError when the template refuses them."""
        return render(self.template, list(messages), tools, tool_choice)

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """A rendered chat's tokens: the template writes its own special tokens, and BOS when it wrote one."""
        return [self.bos] * prompt.bos + self.tokenize(prompt.text, add_special=False, parse_special=True)

    def chat_tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Prompt tokens for a plain chat."""
        return self.prompt_tokens(self.format_chat(messages))

    def single_token(self, text: str) -> int | None:
        """The one token `text` is (a special one such as `<|python_tag|>` too), or None."""
        tokens = self.tokenize(text, add_special=False, parse_special=True)
        return tokens[0] if len(tokens) == 1 else None


class TextStream:
    """Turns a stream of tokens into text, holding back bytes of a character split across tokens."""

    def __init__(self, vocab: Vocab, shown: Collection[int] = ()) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._shown = shown  # special tokens written as their text (a tool-call marker such as [TOOL_CALLS])

    def push(self, token: int) -> str:
        return self._decoder.decode(self._vocab.piece(token, special=token in self._shown))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)

"""A streamed reply split into content that can be shown now and calls, whatever chunks the text comes in.

Content streams until the text may be turning into a call; from there the rest is held and read whole
at the end (parse.py), so the calls never depend on how the reply was cut into chunks, and what was
streamed as content is always the start of the content the whole reply has. What may still become a
call: for Hermes/Qwen the white space and any beginning of `<tool_call>` at the end of the text; for
Mistral any beginning of `[TOOL_CALLS]`; for Llama 3.x and the generic form a reply that starts (after
white space) with `{` or `<|python_tag|>`.
"""

from __future__ import annotations

from kafila.engine.chat.formats import GENERIC, HERMES, LLAMA_3, LLAMA_3_BUILTIN, MISTRAL
from kafila.engine.chat.parse import PYTHON_TAG, TOOL_CALL, TOOL_CALLS, Parsed, parse


def _partial_end(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (0: none)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class CallSplitter:
    """Feed the reply's text with `push` (it returns the content to send now); `finish` gives the rest."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._text = ""
        self._sent = 0  # characters of content already returned
        self._held = False  # the text has turned toward a call: nothing more is sent before the end

    def push(self, piece: str) -> str:
        self._text += piece
        if self._held:
            return ""
        end = self._safe_end()
        out = self._text[self._sent:end]
        self._sent = max(self._sent, end)
        return out

    def finish(self) -> Parsed:
        """The whole reply's calls, and the content not yet returned."""
        whole = parse(self.fmt, self._text)
        assert whole.content.startswith(self._text[:self._sent]), "streamed content is the reply's content"
        return Parsed(whole.content[self._sent:], whole.calls)

    def _safe_end(self) -> int:
        text = self._text
        if self.fmt == HERMES:
            at = text.find(TOOL_CALL)
            end = at if at >= 0 else len(text) - _partial_end(text, TOOL_CALL)
            self._held = at >= 0
            return len(text[:end].rstrip())  # white space before a call is not content
        if self.fmt == MISTRAL:
            at = text.find(TOOL_CALLS)
            self._held = at >= 0
            return at if at >= 0 else len(text) - _partial_end(text, TOOL_CALLS)
        if self.fmt in (LLAMA_3, LLAMA_3_BUILTIN, GENERIC):
            body = text.lstrip()
            if not body:
                return 0
            opens = body.startswith("{") or (self.fmt != GENERIC and (
                body.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(body)))
            if opens and self._sent == 0:
                self._held = body.startswith("{") or body.startswith(PYTHON_TAG)
                return 0
            return len(text)
        return len(text)

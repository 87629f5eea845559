"""The bench's local baseline: its greedy chat reply is llama-cpp-python's own `create_chat_completion`'s."""

from __future__ import annotations

import pytest

from kafila.bench.local_context import greedy_chat
from kafila.model.embedded import resolve_model

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("prompt", ["What is the capital of France?", "Write a haiku about the sea."])
def test_chat_equals_llama_cpp_python(prompt: str) -> None:
    from llama_cpp import Llama

    model = str(resolve_model(None))
    ours = greedy_chat(model, prompt, 512, 128, 40)
    llm = Llama(model, n_ctx=512, n_batch=128, n_ubatch=128, verbose=False)
    try:
        theirs = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=40, temperature=0)
    finally:
        llm.close()
    assert ours["reply"] == theirs["choices"][0]["message"]["content"]
    assert ours["reply_tokens"] == theirs["usage"]["completion_tokens"]
    assert ours["prompt_tokens"] == theirs["usage"]["prompt_tokens"] and ours["ttft_s"] > 0

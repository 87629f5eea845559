"""Long prompts through a real ring: chunked, pipelined prefill with progress, chunked-prefill scheduling,
and a follow-up turn that reuses its conversation's KV cache.

The host runs with `--batch 16`, so a 200-token prompt goes round in 13 chunks on the embedded
model: cheap, yet long enough to show the pipeline and the interleaving. Ground truth is
llama-cpp-python's greedy reply with the same batch size, and one llama.cpp context fed the
batches the head recorded (bit for bit).

Whether a short reply is still decoding while a long prompt is prefilled depended on how the two
requests reached the head: a loaded machine could finish the short reply before the long one arrived.
The members run `kafila join` with the head's chat gated (GATED_HEAD): the short request enters the
head once the long one has reached it, and the long one once the short one has started. No test
here asserts on time.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kafila.planner.ttft import TtftModel
from tests.session.cluster import Cluster
from tests.session.test_ring_e2e import replay_on_one_context

BATCH = 16
LONG = ("Here are some numbers: " + ", ".join(str(i) for i in range(100, 260, 5))
        + ". Which number comes after 255 in this list?")
# ~370 tokens (24 chunks), sharing no cached prefix with LONG beyond the chat template's
LONGER = ("Count these values: " + "; ".join(str(i) for i in range(420, 100, -5))
          + ". Which value comes after 105 in this list?")
SHORT = "Count from 1 to 100, separated by commas."  # a long greedy reply
SHORT_TOKENS = 32  # more decode steps than the long prefill's round trips (24 chunks, a few frames per trip)
MAX_TOKENS = 6

# `kafila join` whose head takes the two requests of the interleaving test in an order set by events: SHORT
# waits until LONGER has reached the head, LONGER until SHORT's first event (its job is then in the head's
# queue, ahead of LONGER's, its prompt prefilling); every other request goes straight through.
GATED_HEAD = f"""
import asyncio, contextlib, sys
import kafila.session.ring.head as head
chat = head.Head.chat
long_arrived, short_started = asyncio.Event(), asyncio.Event()
def prompt(body):
    try:
        return body["messages"][-1]["content"]
    except (KeyError, IndexError, TypeError):
        return None
async def gated(self, body, owner=""):
    p = prompt(body)
    if p == {LONGER!r}:
        long_arrived.set()
        await short_started.wait()
    elif p == {SHORT!r}:
        await long_arrived.wait()
    async with contextlib.aclosing(chat(self, body, owner)) as events:
        async for evt in events:
            if p == {SHORT!r}:
                short_started.set()
            yield evt
head.Head.chat = gated
from kafila.cli import main
sys.exit(main(sys.argv[1:]))
"""
# the module's ring starts (deliveries included) inside the first test's time; a shared, busy
# machine makes that slow, so the bound is generous (no test asserts on time)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory):
    # the planner picks the head: every member runs the gated one
    names = ("ada", "bo", "cy")
    with Cluster(tmp_path_factory.mktemp("long"), [("ada", []), ("bo", ["--throttle", "2"]), ("cy", [])],
                 host_args=["--batch", str(BATCH)], scripts=dict.fromkeys(names, GATED_HEAD)) as cluster:
        cluster.wait_phase({"admitted"})
        yield cluster


@pytest.fixture(scope="module")
def llama_cpp_long(smollm: Path) -> dict[str, Any]:
    """llama-cpp-python's greedy chat completion of LONG, its prompt fed in batches of BATCH tokens."""
    from llama_cpp import Llama

    from kafila.engine.llama_lib import llama

    llama()
    model = Llama(str(smollm), n_ctx=512, n_batch=BATCH, n_ubatch=BATCH, verbose=False)
    try:
        return model.create_chat_completion([{"role": "user", "content": LONG}], max_tokens=MAX_TOKENS,
                                            temperature=0)
    finally:
        model.close()


def trace_since(ring: Cluster, start: int) -> list[dict[str, Any]]:
    lines = ring.trace.read_text().splitlines() if ring.trace.exists() else []
    return [json.loads(line) for line in lines[start:]]


def trace_length(ring: Cluster) -> int:
    return len(ring.trace.read_text().splitlines()) if ring.trace.exists() else 0


def text_of(chunks: list[tuple[float, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for _, c in chunks
                   if c != "[DONE]" and c.get("choices"))


def test_long_prompt_pipelined_equals_llama_cpp(ring: Cluster, llama_cpp_long: dict[str, Any], smollm: Path) -> None:
    start = trace_length(ring)
    chunks = ring.stream_chat(LONG, MAX_TOKENS)
    assert chunks[-1][1] == "[DONE]"
    assert text_of(chunks) == llama_cpp_long["choices"][0]["message"]["content"]

    # the stream shows the prefill: one progress chunk per prompt chunk but the last, counting up
    n_prompt = llama_cpp_long["usage"]["prompt_tokens"]
    progress = [c["kafila"]["progress"] for _, c in chunks if c != "[DONE]" and "progress" in (c.get("kafila") or {})]
    n_chunks = -(-n_prompt // BATCH)
    assert [p["prefilled"] for p in progress] == [BATCH * k for k in range(1, n_chunks)]
    assert {p["prompt_tokens"] for p in progress} == {n_prompt}

    # pipelined: the head had several of the prompt's chunks in the ring at once
    entries = trace_since(ring, start)
    outstanding = most = 0
    for e in entries:
        if "tokens" in e:
            assert len(e["tokens"]) <= BATCH
            outstanding += 1
            most = max(most, outstanding)
        elif "logits" in e:
            outstanding -= 1
    # one frame per stage and one on the wire; the head records a frame's logits after computing
    # its own stage, by when it may already have sent the next frame (+1)
    assert len(ring.members) <= most <= len(ring.members) + 2
    frames, identical = replay_on_one_context(smollm, ring.trace)
    assert frames and identical == frames

    # the head measured this request's time to first token; the host shows it beside the plan's prediction
    # for as many prompt tokens (the plan's TTFT model, chunks of the host's --batch)
    state = ring.wait_state(ring.url, lambda s: (s.get("ttft") or {}).get("prompt_tokens") == n_prompt)
    model = TtftModel.from_json(state["plan"]["ttft"]["model"])
    assert model.n_batch == BATCH and [s.name for s in model.stages] == [*state["plan"]["order"][1:],
                                                                         state["plan"]["head"]]
    assert state["ttft"]["measured_s"] > 0
    assert state["ttft"]["predicted_s"] == pytest.approx(model.predict(n_prompt), rel=1e-9)


def test_short_request_streams_during_long_prefill(ring: Cluster, smollm: Path) -> None:
    """A decoding request's steps go on during another's long prefill, packed into the same frames.

    The two requests reach the head in the order the gate sets (GATED_HEAD), whatever the machine's load:
    the short one is queued first and still has SHORT_TOKENS to decode when the long prompt's chunks start.
    """
    start = trace_length(ring)
    short_chunks: list[tuple[float, Any]] = []
    worker = threading.Thread(target=lambda: short_chunks.extend(ring.stream_chat(SHORT, SHORT_TOKENS)))
    worker.start()
    try:
        long_chunks = ring.stream_chat(LONGER, 1)  # the head takes it once the short request has started
    finally:
        worker.join(600)
    assert short_chunks[-1][1] == "[DONE]" and long_chunks[-1][1] == "[DONE]"
    assert text_of(short_chunks) and text_of(long_chunks)

    # The head's record, in the order it sent frames: the short request's sequence is the first one
    # seen; tokens it sampled in frames sent between the long prompt's first and last chunks show
    # that decode steps went on between prefill chunks, packed into the same frames.
    frames = [e for e in trace_since(ring, start) if "tokens" in e]
    short_seq = frames[0]["seqs"][0]
    long_rows = [i for i, f in enumerate(frames) if any(s != short_seq for s in f["seqs"])]
    first, last = long_rows[0], next(i for i in long_rows if any(
        s != short_seq and w for s, w in zip(frames[i]["seqs"], frames[i]["want"], strict=True)))
    during = frames[first:last]
    sampled = sum(w for f in during for s, w in zip(f["seqs"], f["want"], strict=True) if s == short_seq)
    assert sampled >= 2, f"the short request sampled {sampled} tokens during the long prefill"
    assert any(len(set(f["seqs"])) == 2 for f in during)  # decode rows and prompt rows shared frames
    assert all(len(f["tokens"]) <= BATCH for f in frames)
    frames_compared, identical = replay_on_one_context(smollm, ring.trace)
    assert identical == frames_compared

def chat_messages(ring: Cluster, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(ring.url + "/v1/chat/completions", body, ring.headers())
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def test_follow_up_turn_prefills_only_its_new_tokens(ring: Cluster, smollm: Path) -> None:
    turn1 = [{"role": "user", "content": LONG}]
    first = chat_messages(ring, turn1, MAX_TOKENS)
    start = trace_length(ring)
    turn2 = [*turn1, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And which one comes after that?"}]
    second = chat_messages(ring, turn2, MAX_TOKENS)
    assert second["choices"][0]["message"]["content"]
    n_prompt, cached = second["usage"]["prompt_tokens"], second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]  # turn 1's whole prompt, at least, was not computed again

    # what the stages computed for turn 2: only the prompt's rows from `cached` on, then the reply
    frames = [e for e in trace_since(ring, start) if "tokens" in e]
    prompt_rows = [p for f in frames for p in f["positions"] if p < n_prompt]
    assert sorted(prompt_rows) == list(range(cached, n_prompt))
    assert all(len(f["tokens"]) <= BATCH for f in frames)
    frames_compared, identical = replay_on_one_context(smollm, ring.trace)
    assert frames_compared and identical == frames_compared

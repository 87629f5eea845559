"""Four replies streaming at once through a ring of processes, a member SIGKILLed: after the cut every logits
row of every reply is, bit for bit, the one its uncut computation gives.

The head records each frame it sends (tokens, slots, positions, the rows it wants) and the hash of each
logits row that comes back (KAFILA_TRACE). A reply's rows before the cut went round in frames shared with
the other three, through the member that was lost; after the cut the re-planned ring rebuilds each reply in
the chunks it was first computed in (engine/test_replay.py shows every stage's KV cache then holds the same
bytes) and goes on. Ground truth: one llama.cpp context on the whole file fed that reply alone, in those
chunks. Its rows must equal the ring's before the cut (what the lost stage's ring gave, other replies
sharing its frames) and after it (what the rebuilt ring gives): the uncut ring would have given the same.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.session.cluster import REPLY_TIMEOUT_S, Cluster, check_resumed_reply

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * REPLY_TIMEOUT_S)]

STORIES = ["Tell me a story about a dragon who guards a library.",
           "Tell me a story about a robot who learns to paint.",
           "Tell me a story about a cat who sails the sea.",
           "Tell me a story about a girl who finds a secret door."]  # each runs past MAX_TOKENS alone
MAX_TOKENS = 90
CUT_AFTER_CHARS = 120  # about 30 tokens of every reply have arrived when the member goes


@dataclass
class Computed:
    """One reply's rows in one ring, as the head's trace recorded them."""

    tokens: dict[int, int] = field(default_factory=dict)  # position -> token id
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (first position, rows), in the order sent
    logits: dict[int, str] = field(default_factory=dict)  # position of a wanted row -> its logits' sha256

    def add(self, pos: int, token: int, first: bool) -> None:
        """One more row; `first` of its chunk: rows from `pos` on computed earlier were a rejected draft's,
        which the stages dropped (a trim), so the rows computed now replace them."""
        if first:
            assert all(p + n <= pos or p >= pos for p, n in self.chunks), (pos, self.chunks)
            self.chunks = [(p, n) for p, n in self.chunks if p < pos] + [(pos, 0)]
            self.tokens = {p: t for p, t in self.tokens.items() if p < pos}
            self.logits = {p: h for p, h in self.logits.items() if p < pos}
        self.chunks[-1] = (self.chunks[-1][0], self.chunks[-1][1] + 1)
        self.tokens[pos] = token


def rings(trace: Path) -> list[dict[int, Computed]]:
    """Per ring the trace records (a re-plan starts another), each slot's rows whose logits came back."""
    out: list[dict[int, Computed]] = []
    sent: dict[int, dict[str, Any]] = {}
    for line in trace.read_text().splitlines():
        e = json.loads(line)
        if "ring" in e:
            out.append({})
            sent = {}
        elif "tokens" in e:
            sent[e["frame"]] = e
        elif "logits" in e:  # a frame sent before the loss and never back computed nothing anyone kept
            frame, hashes = sent.pop(e["logits"]), iter(e["rows"])
            # a slot's rows in a frame are one chunk; a speculated step's rows (step > 0) are each computed
            # in a call of their own, as a plain decode step's row (engine/ubatch.py)
            steps = frame["steps"] or [0] * len(frame["seqs"])
            for i, (seq, pos, tok, want) in enumerate(zip(frame["seqs"], frame["positions"], frame["tokens"],
                                                        frame["want"], strict=True)):
                c = out[-1].setdefault(seq, Computed())
                c.add(pos, tok, i == 0 or frame["seqs"][i - 1] != seq or steps[i] != steps[i - 1])
                if want:
                    c.logits[pos] = next(hashes)
            assert next(hashes, None) is None
    return out


def alone(model: Path, chunks: list[tuple[int, int]], tokens: dict[int, int], wanted: set[int]) -> dict[int, str]:
    """One context on the whole file fed one reply alone, in `chunks`: the sha256 of each wanted row's logits."""
    import hashlib

    from kafila.engine.reference import ReferenceContext
    from kafila.engine.stage import ContextConfig, Rows

    ref = ReferenceContext(model, ContextConfig(n_ctx_per_seq=512, n_seq_max=4, n_batch=512))
    out: dict[int, str] = {}
    try:
        for start, n in chunks:
            pos = np.arange(start, start + n, dtype=np.int32)
            want = np.isin(pos, sorted(wanted))
            logits = ref.run(np.array([tokens[p] for p in pos.tolist()], np.int32),
                             Rows(np.zeros(n, np.int32), pos, want))
            out.update({p: hashlib.sha256(row.tobytes()).hexdigest()
                        for p, row in zip(pos[want].tolist(), logits, strict=True)})
    finally:
        ref.close()
    return out


@pytest.mark.parametrize("lost", ["a member", "the head"])
def test_four_replies_cut_by_a_lost_member_go_on_bit_for_bit(tmp_path: Path, smollm: Path, lost: str) -> None:
    """A member or the head SIGKILLed (the next head goes on with the trace in the same file)."""
    with Cluster(tmp_path, [("ada", []), ("bo", []), ("cy", []), ("dee", [])]) as cluster:
        plan = cluster.wait_phase({"admitted"})["plan"]
        victim = plan["head"] if lost == "the head" else next(n for n in plan["order"] if n != plan["head"])
        streaming = [threading.Event() for _ in STORIES]
        with concurrent.futures.ThreadPoolExecutor(len(STORIES)) as pool:
            pending = [pool.submit(cluster.stream_chat, s, MAX_TOKENS, REPLY_TIMEOUT_S, e,
                                   streaming_after=CUT_AFTER_CHARS) for s, e in zip(STORIES, streaming, strict=True)]
            while not all(e.wait(0.1) for e in streaming):
                if ended := [p.result() for p in pending if p.done()]:
                    raise AssertionError(f"a reply ended before the kill: {ended}")
            killed_at = time.monotonic()
            cluster.members[victim].popen.kill()
            replies = [p.result(timeout=REPLY_TIMEOUT_S) for p in pending]
        for chunks in replies:
            check_resumed_reply(chunks, killed_at, None, cluster.host.output[-4000:], lost=victim)
        assert victim not in cluster.wait_phase({"admitted"})["plan"]["order"]
        computed = rings(cluster.trace)

    before, *after = computed
    assert len(before) == len(STORIES) and after, [list(r) for r in computed]
    for seq, first in before.items():
        prompt = min(first.logits)  # the prompt's last row: the first that wanted logits
        # the same reply in the later rings: the slot whose rows hold the same prompt
        later = [c for ring in after for c in ring.values()
                 if all(c.tokens.get(p) == t for p, t in first.tokens.items() if p <= prompt)]
        assert later, seq
        last = later[-1]
        # rebuilt in the chunks it was first computed in: the prompt's, then a row per token
        cut = max(p for p in first.tokens if p in last.tokens and last.logits.get(p) is None) + 1
        assert [c for c in last.chunks if c[0] < cut] == [c for c in first.chunks if c[0] < cut], seq
        after_cut = sum(len(c.logits) for c in later)
        # rows on both sides to compare (a drift's re-plan before the kill may have ended the first ring early)
        assert first.logits and after_cut >= 10, (cut, prompt, after_cut)
        wanted = set(first.logits) | {p for c in later for p in c.logits}
        truth = alone(smollm, last.chunks, last.tokens, wanted)
        for c in (first, *later):
            assert c.logits == {p: truth[p] for p in c.logits}, \
                (seq, [p for p in c.logits if c.logits[p] != truth[p]][:5])
        print(f"slot {seq}: prompt {prompt + 1} tokens in chunks {[n for p, n in first.chunks if p <= prompt]}, "
              f"cut at {cut - prompt} tokens, {len(first.logits)} rows before and {after_cut} after "
              f"({len(later)} later rings) equal the reply computed alone")

"""The golden test: a chain of stages gives logits identical to one llama.cpp context on the whole file.

Both sides are fed the same batches (llama.cpp's numbers may depend on how many rows share a
call); the split must add no difference of its own. Three requests are interleaved: their
prefills and decodes share calls, and each keeps its own KV-cache sequence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kafila.engine.chain import LocalChain, pack, parse_split
from kafila.engine.reference import ReferenceContext
from kafila.engine.request import Chunk
from kafila.engine.stage import ContextConfig
from kafila.model.describe import describe_model
from kafila.model.stage_cache import StageCache
from tests.synthetic import write_synthetic

pytestmark = pytest.mark.fast

CONFIG = ContextConfig(n_ctx_per_seq=256, n_seq_max=4, n_batch=64)
DECODE_STEPS = 32


def _compare(model: Path, split: str, cache: StageCache, prompts: list[list[int]]) -> int:
    """Drive the chain and the reference through the same batches; returns the number of logit rows compared."""
    info = describe_model(model)
    chain = LocalChain(model, parse_split(split, info.n_blocks), CONFIG, cache)
    ref = ReferenceContext(model, CONFIG)
    compared = 0
    try:
        def call(chunks: list[Chunk]) -> np.ndarray:
            nonlocal compared
            tokens, rows = pack(chunks)
            ours, theirs = chain.forward(tokens, rows), ref.run(tokens, rows)
            assert ours.shape == theirs.shape
            assert np.array_equal(ours, theirs), f"split {split}: max |diff| {np.abs(ours - theirs).max()}"
            compared += len(ours)
            return ours

        a, b, c = prompts
        # request 0 prefills alone in two chunks (the first wants no logits)
        call([Chunk(0, a[:5], 0, False)])
        last = {0: call([Chunk(0, a[5:], 5, True)])[0]}
        pos = {0: len(a)}
        # request 1 prefills while request 0 decodes; then request 2 joins
        out = call([Chunk(1, b, 0, True), Chunk(0, [int(np.argmax(last[0]))], pos[0], True)])
        last, pos = {1: out[0], 0: out[1]}, {1: len(b), 0: pos[0] + 1}
        out = call([Chunk(0, [int(np.argmax(last[0]))], pos[0], True), Chunk(2, c, 0, True),
                    Chunk(1, [int(np.argmax(last[1]))], pos[1], True)])
        last, pos = {0: out[0], 2: out[1], 1: out[2]}, {0: pos[0] + 1, 2: len(c), 1: pos[1] + 1}
        for step in range(DECODE_STEPS):
            live = [0, 1, 2] if step < DECODE_STEPS - 8 else [2, 0]  # 1 finishes early
            if step == DECODE_STEPS - 8:
                chain.free(1)
                ref.free(1)
            out = call([Chunk(s, [int(np.argmax(last[s]))], pos[s], True) for s in live])
            for s, row in zip(live, out, strict=True):
                last[s], pos[s] = row, pos[s] + 1
    finally:
        chain.close()
        ref.close()
    return compared


@pytest.mark.slow
@pytest.mark.parametrize("split", ["", "10", "10,20", "3,29"])
def test_smollm_chain_identical(smollm: Path, stage_cache: StageCache, split: str) -> None:
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 49152, n).tolist() for n in (11, 6, 17)]
    assert _compare(smollm, split, stage_cache, prompts) == 1 + 2 + 3 + 3 * (DECODE_STEPS - 8) + 2 * 8


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama-untied"])
@pytest.mark.parametrize("split", ["", "2", "1,3"])
def test_synthetic_chain_identical(synthetic_models: dict[str, Path], stage_cache: StageCache, arch: str,
                                   split: str) -> None:
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 32, n).tolist() for n in (9, 4, 13)]
    assert _compare(synthetic_models[arch], split, stage_cache, prompts) > DECODE_STEPS


# Architectures whose cut needs what their profile says (kafila/model/arch.py): the sliding-window
# pattern per layer (gemma3, gpt-oss), the head's sqrt(n_embd) input scale (gemma3), a body-stage
# output stub (gpt-oss), global tensors (llama3's rope_freqs), experts inside blocks (qwen3moe), the
# input restored over Gemma 1/2's unconditional input scale in every stage but the first.
# Prompts of 40 and 25 tokens plus the decode steps run well past the 16-token window.
PROFILED = {
    "llama3": (4, ["", "2", "1,3"]),
    "qwen3moe": (6, ["", "2,5", "3"]),
    "phi3": (4, ["", "2", "1,3"]),
    # 5,6: a stage of block 5 alone, a global layer: the cutter selects gemma3's plain graph
    "gemma3": (8, ["", "3", "2,7", "5,6"]),
    "gpt-oss": (6, ["", "1,4", "3"]),
    "gemma2": (6, ["", "3", "2,4"]),
    "gemma": (4, ["", "2", "1,3"]),
}


@pytest.fixture(scope="module")
def profiled_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("profiled")
    return {arch: write_synthetic(d / f"{arch}.gguf", arch, n_blocks=n, seed=3) for arch, (n, _) in PROFILED.items()}


@pytest.mark.parametrize(("arch", "split"), [(a, s) for a, (_, splits) in PROFILED.items() for s in splits])
def test_profiled_chain_identical(profiled_models: dict[str, Path], stage_cache: StageCache, arch: str,
                                  split: str) -> None:
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 30, n).tolist() for n in (40, 6, 25)]
    assert _compare(profiled_models[arch], split, stage_cache, prompts) == 1 + 2 + 3 + 3 * (DECODE_STEPS - 8) + 2 * 8


@pytest.mark.slow
def test_trimmed_sequence_reused_identical(smollm: Path, stage_cache: StageCache) -> None:
    """A follow-up turn: a sequence's cache trimmed to a shared prefix, then only the new tokens fed."""
    info = describe_model(smollm)
    chain = LocalChain(smollm, parse_split("10", info.n_blocks), CONFIG, stage_cache)
    ref = ReferenceContext(smollm, CONFIG)
    rng = np.random.default_rng(4)
    turn1, tail1, tail2 = (rng.integers(0, 49152, n).tolist() for n in (20, 6, 9))
    try:
        def call(chunks: list[Chunk]) -> None:
            tokens, rows = pack(chunks)
            assert np.array_equal(chain.forward(tokens, rows), ref.run(tokens, rows))

        call([Chunk(1, turn1 + tail1, 0, True)])  # turn 1 and its reply
        keep = len(turn1) + 2  # turn 2 shares the prompt and the reply's first two tokens
        chain.free(1, keep)
        ref.free(1, keep)
        call([Chunk(1, tail2, keep, True)])
        for step in range(4):
            call([Chunk(1, [tail2[step]], keep + len(tail2) + step, True)])
    finally:
        chain.close()
        ref.close()

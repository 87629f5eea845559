"""`kafila generate`: a raw completion through a local chain of stages (no network)."""

from __future__ import annotations

import argparse
import sys

from kafila.commands._common import add_model_arg, add_sampling_args, byte_progress

HELP = "complete a prompt through a local chain of stages (the split model, in one process)"


def configure(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--split", default="", help="block boundaries, e.g. 10,20 for [0,10) [10,20) [20,n); head last")
    add_sampling_args(p)
    p.add_argument("prompt", help="the prompt (raw completion, no chat template)")


def run(args: argparse.Namespace) -> int:
    from kafila.engine.chain import open_chain
    from kafila.engine.request import Request
    from kafila.engine.sampler import Sampler, SamplingParams
    from kafila.engine.stage import ContextConfig
    from kafila.errors import KafilaError
    from kafila.model.embedded import resolve_model
    from kafila.model.stage_cache import StageCache

    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as exc:
        raise KafilaError(str(exc)) from None
    if args.max_tokens < 1:
        raise KafilaError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    model = resolve_model(args.model)
    config = ContextConfig(n_ctx_per_seq=args.context, n_seq_max=1)
    with byte_progress("cutting stages") as progress:
        chain = open_chain(model, args.split, config, StageCache(), progress)
    try:
        request = Request(0, chain.vocab.tokenize(args.prompt), args.max_tokens, args.context,
                          Sampler(sampling), chain.vocab)
        for _, piece in chain.run([request]):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    finally:
        chain.close()
    return 0
